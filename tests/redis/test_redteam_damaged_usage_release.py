"""Red team: a card's usage damaged by a hand edit reads as the card full (`used` in _lib.lua) until the watchers'
pass rewrites it; a give-back on it wrote the full value less the holder's share, a whole number that reads as sound.
Where the card holds more than it has (the API's truth: `observe` books what bound pods carry, and a lowered
`max_inst` leaves slices past the limit), that is less than the other holders keep: the card read as having room it
has not, and the next booking went past it (80 units over a held 90 on a 96-unit card) before any pass saw it. A
give-back on a damaged card now leaves it full (the pass rewrites it from its reservations).

Real parts: redis-server, the product's Ledger (observe, release, reserve)."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from shared.domain.annotations import PodUsage
from shared.store.ledger import Ledger
from tests.redis.test_reconcile_touched import setup

pytestmark = pytest.mark.redis


@pytest.mark.parametrize(("field", "ask"), [("mem_used", (80, 1, 1)), ("cores_used", (2, 10, 1))])
async def test_a_give_back_on_a_damaged_card_does_not_open_it_past_its_holders(
        ledger: Ledger, redis_client: Redis, field: str, ask: tuple[int, int, int]) -> None:
    await setup(ledger)
    # two bound pods the API says hold 90 units and 10 cores each of card 0 (96 units, 16 cores): over-committed
    for uid in ("a", "b"):
        await ledger.observe(uid, PodUsage("ta", (0,), 90, 10, 1))
    await redis_client.hset(ledger.keys.card("ta", 0), field, "zz")  # type: ignore[misc]
    assert await ledger.release("ta", "a")  # b still holds 90 units and 10 cores
    booked = (await ledger.reserve("ta", "c", [0], *ask, pod="ns/c"))[0]
    assert not booked.ok, f"booked {ask} on card 0 while b holds 90 units and 10 cores of its 96 and 16"
