"""Red team: a card's usage fields damaged by a hand edit (docs/redis-layout.md: `mem_used`, `cores_used`,
`slices` not a whole number, negative, gone; `cores` or `slice_limit` beyond what a card has). The scripts read
them with num(), which made any such value 0 (and kept a negative one), so the next booking went past the card:
another pod's 90 units booked over a held 90 on a 96-unit card, or 128 units on an empty 96-unit card, until a pass
repaired the usage, after the over-commit was booked and bound. Such a card now reads as full (fail closed) until
the watchers' pass finds that its usage does not add up to its reservations and rewrites it."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from shared.store.ledger import Ledger
from tests.redis.helpers import S4000, inventory, violations
from tests.redis.test_reconcile_touched import setup

pytestmark = pytest.mark.redis

# (field, value, what the booking asks: mem, cores, slices)
EDITS = [
    ("mem_used", "zz", (90, 2, 1)),
    ("mem_used", "-50", (90, 2, 1)),
    ("mem_used", "1e400", (2, 1, 1)),
    ("mem_used", None, (90, 2, 1)),
    ("cores_used", "-16", (2, 15, 1)),
    ("cores_used", "nan", (2, 15, 1)),
    ("cores", "1000", (2, 15, 1)),
    ("slices", "-20", (2, 1, 1)),
    ("slice_limit", "99", (2, 1, 1)),
]


@pytest.mark.parametrize(("field", "value", "ask"), EDITS, ids=[f"{f}={v}" for f, v, _ in EDITS])
async def test_a_damaged_usage_field_books_nothing_past_the_card(ledger: Ledger, redis_client: Redis, field: str,
                                                                 value: str | None, ask: tuple[int, int, int]) -> None:
    rec, _pods = await setup(ledger)
    # the card holds 90 of 96 units and 14 of 16 cores; for the slices' fields, its only slice (slice_limit 1)
    if field in ("slices", "slice_limit"):
        await ledger.upsert_node(inventory("ta", S4000, slice_limit=1))
    assert (await ledger.reserve("ta", "u1", [0], 90, 14, 1, pod="ns/p1"))[0].ok
    key = ledger.keys.card("ta", 0)
    if value is None:
        await redis_client.hdel(key, field)  # type: ignore[misc]
    else:
        await redis_client.hset(key, field, value)  # type: ignore[misc]
    mem, cores, slices = ask
    booked = (await ledger.reserve("ta", "u2", [0], mem, cores, slices, pod="ns/p2"))[0]
    assert not booked.ok, f"booked past the card after {field}={value}: {booked}"
    # the watchers' pass rewrites the card from its reservations: as before the edit, and a booking that fits is
    # taken (before the pass it is refused, fail closed)
    await rec.reconcile_all()
    snap = (await ledger.snapshots(["ta"]))["ta"]
    assert violations(snap) == []
    card = snap.cards[0]
    assert (card.mem_used, card.cores_used, card.slices, card.capacity) == (90, 14, 1, S4000)


@pytest.mark.parametrize(("field", "value"), [("mem", "-50"), ("mem", "abc"), ("mem", "1e400"), ("mem", None),
                                              ("cores", "-10"), ("slices", "x"), ("cards", "x,y"), ("cards", "")])
async def test_a_pending_booking_with_damaged_amounts_keeps_its_card(ledger: Ledger, redis_client: Redis, field: str,
                                                                     value: str | None) -> None:
    """A pending booking (its Binding may be in flight) whose amounts a hand edit damaged was counted by the
    reconciler's repair of its node as holding nothing (num() read "abc" as 0, and "-50" as -50): the card read
    free, and another pod booked the room its binder holds (90 units over its 60 on a 96-unit card); one whose cards
    were damaged was booked on none. The repair now books such a booking as holding its cards whole (every card of the
    node when which ones cannot be read), until it is released or its pod's record replaces it."""
    rec, _pods = await setup(ledger)
    assert (await ledger.reserve("ta", "u1", [0], 60, 8, 1, pod="ns/p1"))[0].ok
    key = ledger.keys.res("ta", "u1")
    if value is None:
        await redis_client.hdel(key, field)  # type: ignore[misc]
    else:
        await redis_client.hset(key, field, value)  # type: ignore[misc]
    await redis_client.hset(ledger.keys.card("ta", 1), "mem_used", 5)  # type: ignore[misc]  # a drift: the node is repaired
    assert await rec.reconcile_all()
    booked = (await ledger.reserve("ta", "u2", [0], 90, 2, 1, pod="ns/p2"))[0]
    assert not booked.ok, f"booked over a pending booking whose {field} was {value}: {booked}"
    assert await ledger.release("ta", "u1")  # its binder gave up: the cards are free again, and nothing else held
    for card in (await ledger.snapshots(["ta"]))["ta"].cards.values():
        assert (card.mem_used, card.cores_used, card.slices) == (0, 0, 0), card
