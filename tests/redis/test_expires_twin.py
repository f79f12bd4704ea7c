"""`expires` and its Lua twin agree: one table of reservations (state, stamp, TTL) runs through
shared.domain.reconcile.expires, the janitor's choice of what to offer for expiry, and through expire.lua on a
real redis-server, which releases it or not. Offsets stay seconds away from every boundary: the script's clock
reads a few milliseconds after the test's."""

from __future__ import annotations

from dataclasses import replace
from itertools import count

import pytest

from shared.domain.reconcile import FUTURE_MS, expires, restamps
from shared.domain.state import Reservation
from shared.store.ledger import Ledger
from tests.redis.helpers import S4000, inventory

pytestmark = pytest.mark.redis

S = 1000
_n = count()

# (case, state, created - now, ttl_ms, settle_by - now (None: no stamp), released)
CASES: list[tuple[str, str, int, int, int | None, bool]] = [
    ("pending, just made", "pending", -1 * S, 120 * S, None, False),
    ("pending, under its TTL", "pending", -100 * S, 120 * S, None, False),
    ("pending past its TTL: the binder died", "pending", -130 * S, 120 * S, None, True),
    ("pending past a short TTL", "pending", -5 * S, 1 * S, None, True),
    ("pending stamped a little ahead", "pending", 30 * S, 120 * S, None, False),
    # stamped anew at the script's now (restamps): its Binding may be in flight, it expires a TTL later
    ("pending stamped by a clock that jumped", "pending", FUTURE_MS + 30 * S, 120 * S, None, False),
    ("bound long ago", "bound", -600 * S, 120 * S, None, False),
    ("bound, stamped by a clock that jumped", "bound", FUTURE_MS + 30 * S, 120 * S, None, False),
    # a later bind attempt reused the booking: its Binding may still be committed (settle_by)
    ("pending past its TTL, a retry's Binding in flight", "pending", -130 * S, 120 * S, 4 * S, False),
    ("pending past its TTL, a retry's Binding settled", "pending", -130 * S, 120 * S, -2 * S, True),
    ("pending past its TTL, settle_by from a clock that jumped", "pending", -130 * S, 120 * S,
     FUTURE_MS + 30 * S, False),
]


@pytest.mark.parametrize(("case", "state", "created", "ttl_ms", "settle_by", "want"), CASES,
                         ids=[c[0] for c in CASES])
async def test_expires_agrees_with_its_lua_twin(ledger: Ledger, case: str, state: str, created: int, ttl_ms: int,
                                                settle_by: int | None, want: bool) -> None:
    now = await ledger.redis_time_ms()
    r = Reservation("u1", (0,), 2, 1, 1, state, now + created,
                    settle_by=0 if settle_by is None else now + settle_by)
    assert expires(r, now, ttl_ms) is want, case
    for only in (None, ["u1"]):  # as any caller, and as the janitor (its vetted list names the uid)
        node = f"ex{next(_n)}"
        await ledger.upsert_node(inventory(node, S4000))
        assert (await ledger.reserve(node, "u1", [0], 2, 1, 1))[0].ok
        # the stamp and state as the case has them (the reserve script stamped now, pending)
        await ledger.redis.hset(ledger.keys.res(node, "u1"),  # type: ignore[misc]
                                mapping={"state": state, "created": r.created, "settle_by": r.settle_by})
        assert (await ledger.expire(node, ttl_ms / 1000, only=only) == ["u1"]) is want, (case, only)
        if restamps(r, now):  # stamped anew at the script's now, and no Binding in flight counted from the future
            got = await ledger.redis.hmget(ledger.keys.res(node, "u1"), ["created", "settle_by"])  # type: ignore[misc]
            assert now <= int(got[0]) <= await ledger.redis_time_ms() and int(got[1]) <= int(got[0]), (case, got)
            assert not restamps(replace(r, created=int(got[0]), settle_by=int(got[1])), now), case
