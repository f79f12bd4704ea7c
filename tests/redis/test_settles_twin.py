"""`settles` and its Lua twin agree: one table of reservations (state, stamps, keep window) runs through
shared.domain.reconcile.settles and through remove_node.lua on a real redis-server (which leaves a node
where a reservation settles and answers -1, else forgets it). Offsets stay seconds away from every
boundary: the script's clock reads a few milliseconds after the test's."""

from __future__ import annotations

from itertools import count

import pytest

from shared.domain.reconcile import FUTURE_MS, settles
from shared.domain.state import Reservation
from shared.store.ledger import Ledger
from tests.redis.helpers import S4000, inventory

pytestmark = pytest.mark.redis

S = 1000
_n = count()

# (case, state, created - now, bound_at - now or None (not bound), keep_ms, settles)
CASES: list[tuple[str, str, int, int | None, int, bool]] = [
    ("pending, just made", "pending", -1 * S, None, 10 * S, True),
    ("pending for minutes: the janitor's, not ours", "pending", -600 * S, None, 10 * S, True),
    ("pending, no keep window", "pending", -600 * S, None, 0, True),
    ("pending stamped a little ahead", "pending", 30 * S, None, 10 * S, True),
    # its Binding may be in flight (the clock stepped back since it was made): the janitor's (restamps)
    ("pending stamped by a clock that jumped", "pending", FUTURE_MS + 30 * S, None, 10 * S, True),
    ("bound inside the window", "bound", -60 * S, -5 * S, 10 * S, True),
    ("bound before the window", "bound", -60 * S, -15 * S, 10 * S, False),
    ("made inside the window, bound stamp missing", "bound", -5 * S, 0, 10 * S, True),
    ("made and bound before the window", "bound", -30 * S, -20 * S, 10 * S, False),
    ("bound, no keep window", "bound", -60 * S, -5 * S, 0, False),
    ("bound stamped a little ahead", "bound", -60 * S, 30 * S, 10 * S, True),
    ("bound stamped by a clock that jumped", "bound", -60 * S, FUTURE_MS + 30 * S, 10 * S, False),
]


@pytest.mark.parametrize(("case", "state", "created", "bound_at", "keep_ms", "want"), CASES,
                         ids=[c[0] for c in CASES])
async def test_settles_agrees_with_its_lua_twin(ledger: Ledger, case: str, state: str, created: int,
                                                bound_at: int | None, keep_ms: int, want: bool) -> None:
    now = await ledger.redis_time_ms()
    b = 0 if bound_at is None else (now + bound_at if bound_at else 0)
    r = Reservation("u1", (0,), 2, 1, 1, state, now + created, b)
    assert settles(r, now, now - keep_ms) is want, case
    node = f"tw{next(_n)}"
    await ledger.upsert_node(inventory(node, S4000))
    assert (await ledger.reserve(node, "u1", [0], 2, 1, 1))[0].ok
    # the stamps as the case has them (the reserve script stamped now)
    await ledger.redis.hset(ledger.keys.res(node, "u1"),  # type: ignore[misc]
                            mapping={"state": state, "created": r.created, "bound_at": r.bound_at})
    out = await ledger.remove_node(node, keep_ms)
    assert (out is None) is want, case
