"""`tombstoned` and its Lua twin agree: one table of tombstones (none, or stamped some time from now) runs through
shared.domain.ended.tombstoned and through observe.lua and replace_node.lua on a real redis-server, which book the
pod's record or not. Offsets stay a minute away from every boundary: the script's clock reads a few milliseconds
after the test's."""

from __future__ import annotations

from itertools import count

import pytest

from shared.domain.annotations import PodUsage
from shared.domain.ended import ENDED_KEEP_MS, tombstoned, trim_before
from shared.store.ledger import Ledger
from tests.redis.helpers import S4000, inventory

pytestmark = pytest.mark.redis

S = 1000
_n = count()

# (case, tombstone's stamp - now (None: no tombstone), booked)
CASES: list[tuple[str, int | None, bool]] = [
    ("no tombstone: the record is booked (a booking the janitor expired, or Redis lost)", None, True),
    ("tombstoned just now: its release came first", -1 * S, False),
    ("tombstoned minutes ago, within the keep window", -(ENDED_KEEP_MS - 60 * S), False),
    ("tombstoned past the keep window: forgotten", -(ENDED_KEEP_MS + 60 * S), True),
    ("tombstoned by a clock that ran ahead: a uid is never reused", 60 * S, False),
]


@pytest.mark.parametrize(("case", "offset", "booked"), CASES, ids=[c[0] for c in CASES])
async def test_tombstoned_agrees_with_its_lua_twin(ledger: Ledger, case: str, offset: int | None,
                                                   booked: bool) -> None:
    now = await ledger.redis_time_ms()
    at = None if offset is None else now + offset
    assert tombstoned(at, now) is not booked, case
    assert (at is not None and at < trim_before(now)) == (offset is not None and booked), case
    for via in ("observe", "replace_node"):
        node = f"en{next(_n)}"
        await ledger.upsert_node(inventory(node, S4000))
        if at is not None:
            await ledger.redis.zadd(ledger.keys.ended(node), {"u1": at})  # type: ignore[misc]
        usage = PodUsage(node, (0,), 2, 1, 1)
        if via == "observe":
            out = await ledger.observe("u1", usage, "ns/p1", keep_bound=True)
            assert bool(out.get("ended")) is not booked, (case, out)
        else:
            out = await ledger.replace_node(inventory(node, S4000), {"u1": (usage, "ns/p1")}, 10_000, keep_bound=True)
            assert (out["ended"] == ["u1"]) is not booked, (case, out)
        snap = (await ledger.snapshots([node]))[node]
        assert ("u1" in snap.reservations) is booked, (case, via, snap)
