"""`tombstoned`, `next_trim` and `trim_due` agree with their Lua twins: one table of tombstones (none, or stamped some
time from now) runs through shared.domain.ended.tombstoned and through observe.lua and replace_node.lua on a real
redis-server, which book the pod's record or not, and which a trim keeps or drops; one table of trims (tombstones
kept, past the window) through next_trim and through release.lua's trim; one table of counts and last trims through
trim_due and through release.lua, which trims or not. Offsets stay a minute away from every
boundary: the script's clock reads a few milliseconds after the test's."""

from __future__ import annotations

from itertools import count

import pytest

from shared.domain.annotations import PodUsage
from shared.domain.ended import ENDED_KEEP_MS, ENDED_TRIM_FLOOR, next_trim, tombstoned, trim_due
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
    for via in ("observe", "replace_node"):
        node = f"en{next(_n)}"
        await ledger.upsert_node(inventory(node, S4000))
        if at is not None:
            await ledger.redis.hset(ledger.keys.ended(node), "u1", at)  # type: ignore[misc]
        usage = PodUsage(node, (0,), 2, 1, 1)
        if via == "observe":
            out = await ledger.observe("u1", usage, "ns/p1", keep_bound=True)
            assert bool(out.get("ended")) is not booked, (case, out)
        else:
            out = await ledger.replace_node(inventory(node, S4000), {"u1": (usage, "ns/p1")}, 10_000, keep_bound=True)
            assert (out["ended"] == ["u1"]) is not booked, (case, out)
        snap = (await ledger.snapshots([node]))[node]
        assert ("u1" in snap.reservations) is booked, (case, via, snap)


async def test_a_tombstone_is_trimmed_as_tombstoned_says(ledger: Ledger) -> None:
    """The trim (release.lua, when due) drops exactly the tombstones `tombstoned` no longer counts."""
    node = f"en{next(_n)}"
    await ledger.upsert_node(inventory(node, S4000))
    now = await ledger.redis_time_ms()
    stamps = {f"c{i}": None if offset is None else now + offset for i, (_c, offset, _b) in enumerate(CASES)}
    key = ledger.keys.ended(node)
    await ledger.redis.hset(key, mapping={u: at for u, at in stamps.items() if at is not None})  # type: ignore[misc]
    await ledger.redis.hset(key, mapping={"#n": ENDED_TRIM_FLOOR - 1, "#trimmed": now})  # type: ignore[misc]
    assert await ledger.release(node, "last", ended=True) is False  # the write that brings the trim
    left = set(await ledger.redis.hkeys(key))  # type: ignore[misc]
    assert left - {"#n", "#trim_at", "#trimmed", "last"} == {u for u, at in stamps.items() if tombstoned(at, now)}, left


# (tombstones kept by the trim, besides the one written: those within the window; `#trim_at` then is next_trim's)
TRIMS = [0, 5, ENDED_TRIM_FLOOR // 2 - 1, ENDED_TRIM_FLOOR // 2, 150]


@pytest.mark.parametrize("live", TRIMS)
async def test_next_trim_agrees_with_its_lua_twin(ledger: Ledger, live: int) -> None:
    node = f"en{next(_n)}"
    await ledger.upsert_node(inventory(node, S4000))
    now = await ledger.redis_time_ms()
    key = ledger.keys.ended(node)
    fields: dict[str, int] = {f"l{i}": now - 60 * S for i in range(live)}
    fields.update({f"o{i}": now - ENDED_KEEP_MS - 60 * S for i in range(7)})
    fields.update({"#n": 299, "#trim_at": 300, "#trimmed": now})
    await ledger.redis.hset(key, mapping=fields)  # type: ignore[misc]
    assert await ledger.release(node, "last", ended=True) is False
    got = await ledger.redis.hmget(key, ["#n", "#trim_at"])  # type: ignore[misc]
    assert [int(v) for v in got] == [live + 1, next_trim(live + 1)], (live, got)


# (case, `#n` before the write, `#trim_at`, the last trim's stamp - now (None: no trim yet), trimmed)
DUE: list[tuple[str, int, int, int | None, bool]] = [
    ("below #trim_at, trimmed a minute ago", 10, 300, -60 * S, False),
    ("the write that brings #n to #trim_at", 299, 300, -60 * S, True),
    ("below #trim_at, the last trim past the window (a burst long past)", 10, 300, -(ENDED_KEEP_MS + 60 * S), True),
    ("below #trim_at, never trimmed (a hash of before #trimmed)", 10, 300, None, True),
    ("below #trim_at, the last trim stamped by a clock that ran ahead", 10, 300, 60 * S, False),
]


@pytest.mark.parametrize(("case", "n", "trim_at", "offset", "trimmed"), DUE, ids=[c[0] for c in DUE])
async def test_trim_due_agrees_with_its_lua_twin(ledger: Ledger, case: str, n: int, trim_at: int,
                                                 offset: int | None, trimmed: bool) -> None:
    node = f"en{next(_n)}"
    await ledger.upsert_node(inventory(node, S4000))
    now = await ledger.redis_time_ms()
    at = None if offset is None else now + offset
    assert trim_due(n + 1, trim_at, at, now) is trimmed, case
    key = ledger.keys.ended(node)
    fields: dict[str, int] = {"stale": now - ENDED_KEEP_MS - 60 * S, "#n": n, "#trim_at": trim_at}
    if at is not None:
        fields["#trimmed"] = at
    await ledger.redis.hset(key, mapping=fields)  # type: ignore[misc]
    assert await ledger.release(node, "last", ended=True) is False
    assert (not await ledger.redis.hexists(key, "stale")) is trimmed, case  # type: ignore[misc]
