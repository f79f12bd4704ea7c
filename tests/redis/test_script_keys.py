"""Every ledger script declares every key it touches in KEYS (Redis Cluster requires it).

The scripts run on a real redis-server behind a test-only prelude (tests/redis/lua/strict_keys.lua)
that fails any redis.call on a key not in KEYS. Each step runs on a ledger that knows nothing of the
node yet (so the scripts' MOREKEYS discovery is exercised) and on one that does; together the steps
take every script through the branches that touch keys: booking, refusal (with the node's state),
idempotent repeats, replacing a booking, unknown cards, removed cards, expiry, rebuild, removal.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest
from redis.asyncio import Redis

from shared.domain.annotations import PodUsage
from shared.store.keys import Known
from shared.store.ledger import SCRIPTS, Ledger, LedgerError
from shared.store.ledger_core import Payload
from tests.redis.helpers import S4000, S5000, inventory, violations

# Also run on Sentinel and Cluster: tests/redis_ha/test_behaviour.py.
STRICT = (Path(__file__).parent / "lua" / "strict_keys.lua").read_text()


class StrictLedger(Ledger):
    """A Ledger whose scripts fail on any key not in KEYS; records which scripts it ran."""

    ran: ClassVar[set[str]] = set()

    @staticmethod
    def _source(name: str) -> str:
        return STRICT + "\n" + Ledger._source(name)

    async def _call(self, name: str, node: str, payload: Payload | None = None,
                    keys: Any = None, give_up: Any = None, resent: Any = None) -> Any:
        StrictLedger.ran.add(name)
        return await super()._call(name, node, payload, keys, give_up, resent)


@pytest.fixture
async def warm(redis_client: Redis) -> StrictLedger:
    return StrictLedger(redis_client)


def cold(led: Ledger) -> StrictLedger:
    """A ledger on the same Redis that has seen nothing (as a replica that just started)."""
    return StrictLedger(led.redis)


@pytest.mark.redis
async def test_every_script_declares_every_key_it_touches(warm: StrictLedger) -> None:
    led = warm
    StrictLedger.ran = set()
    assert await cold(led).upsert_node(inventory("n4", S4000)) == 1
    assert await led.upsert_node(inventory("n5", S5000)) == 1
    # booking, the idempotent repeat, refusals with the node's state (all cards known / not all known)
    assert (await cold(led).reserve("n4", "u1", [0], 8, 2, 1, pod="ns/p1"))[0].ok
    again, _ = await cold(led).reserve("n4", "u1", [1], 8, 2, 1)
    assert again.ok and again.existing and again.cards == (0,)
    await led.snapshot("n4")
    before = await led.redis_time_ms()
    assert before <= await led.clock("n4") <= await led.redis_time_ms()  # one server: one clock
    refused, fresh = await led.reserve("n4", "u2", [0], S4000, 16, 1, whole=True)
    assert refused.reason == "ExclusiveDeviceAllocateConflict" and fresh is not None and set(fresh.cards) == {0, 1}
    refused, fresh = await cold(led).reserve("n4", "u2", [0], S4000, 16, 1, whole=True)
    assert not refused.ok and fresh is None  # it did not know the node's cards: the caller reads the node
    assert await cold(led).mark_bound("n4", "u1")
    # observe: a new booking, the same again, a different one (replaced), an unknown card, kept bound
    assert (await cold(led).observe("u3", PodUsage("n4", (1,), 8, 1, 1), "ns/p3"))["changed"]
    assert not (await cold(led).observe("u3", PodUsage("n4", (1,), 8, 1, 1), "ns/p3"))["changed"]
    assert (await cold(led).observe("u3", PodUsage("n4", (0,), 8, 1, 1), "ns/p3"))["changed"]
    assert (await cold(led).observe("u4", PodUsage("n4", (7,), 4, 1, 1), "ns/p4"))["ok"]
    kept = await cold(led).observe("u1", PodUsage("n4", (1,), 2, 1, 1), "ns/p1", keep_bound=True)
    assert kept.get("kept") is True
    # a card no longer reported stays "removed" while held, and disappears with its last holder
    assert (await led.reserve("n4", "u5", [1], 8, 1, 1))[0].ok
    assert await cold(led).upsert_node(inventory("n4", S4000, 1)) > 1
    assert (await cold(led).snapshot("n4")).cards[1].health == "removed"  # type: ignore[union-attr]
    assert await cold(led).release("n4", "u5") and not await cold(led).release("n4", "u5")
    assert 1 not in (await cold(led).snapshot("n4")).cards  # type: ignore[union-attr]
    # expire: a pending booking past its TTL (one stamped from a clock far ahead is stamped anew, not released)
    assert (await led.reserve("n5", "u6", [1], 8, 1, 1))[0].ok
    await led.redis.hset(led.keys.res("n5", "u6"), "created", str(await led.redis_time_ms() - 3_600_000))
    assert await cold(led).expire("n5", 60) == ["u6"]
    # rebuild: bound pods, a pending booking kept, a bound booking kept (keep_bound), unknown nodes removed
    assert (await led.reserve("n4", "u7", [0], 2, 1, 1))[0].ok
    bound = {"u1": (PodUsage("n4", (1,), 2, 1, 1), "ns/p1"), "u8": (PodUsage("n4", (3,), 4, 1, 1), "ns/p8")}
    out = await cold(led).replace_node(inventory("n4", S4000, 2), bound, keep_bound=True)
    assert out["pending_kept"] == 1 and out["kept_bound"] == ["u1"]
    snaps = await cold(led).snapshots(["n4", "n5", "ghost"])
    assert sorted(snaps) == ["n4", "n5"] and violations(snaps["n4"], allow_overcommit=True) == []
    assert set(snaps["n4"].reservations) == {"u1", "u7", "u8"}
    await led.list_node("gone")
    await led.rebuild([inventory("n4", S4000)], {})
    assert await cold(led).remove_node("n5") is False  # rebuild removed it already
    assert await led.nodes() == ["n4"]
    assert StrictLedger.ran == set(SCRIPTS)


@pytest.mark.redis
async def test_a_script_that_touches_an_undeclared_key_fails(warm: StrictLedger) -> None:
    """The check itself: a script that reads one key more than its KEYS is refused, and nothing changes."""

    class Broken(StrictLedger):
        @staticmethod
        def _source(name: str) -> str:
            src = StrictLedger._source(name)
            if name == "release":  # reads a card the reservation does not hold (the line must be there: asserted)
                line = "local r = res_of(p.uid)"
                assert line in src
                src = src.replace(line, "redis.call('HGETALL', card_key(99))\n" + line)
            return src

    assert await warm.upsert_node(inventory("n4", S4000)) == 1
    assert (await warm.reserve("n4", "u1", [0], 8, 1, 1))[0].ok
    with pytest.raises(LedgerError, match=r"UNDECLARED HGETALL mt:\{n4\}:card:99"):
        await Broken(warm.redis).release("n4", "u1")


@pytest.mark.redis
async def test_keys_are_all_of_the_node_and_built_in_one_place(warm: StrictLedger) -> None:
    """Every KEYS list starts with the node hash and stays under the node's hash tag (one slot)."""
    k, known = warm.keys, Known(frozenset({"0", "3"}), frozenset({"a"}))
    lists = [k.upsert_node("n", [1], known), k.reserve("n", "u", [1], known), k.mark_bound("n", "u"),
             k.release("n", "u", known), k.observe("n", "u", [2], known), k.snapshot("n", known),
             k.expire("n", known), k.remove_node("n", known), k.replace_node("n", [1], [("b", [4])], known)]
    for keys in lists:
        assert keys[0] == "mt:{n}:node" and all(x.startswith("mt:{n}:") for x in keys) and len(set(keys)) == len(keys)
    assert k.reserve("n", "u", [1], known) == ["mt:{n}:node", "mt:{n}:pods", "mt:{n}:card:0", "mt:{n}:card:1",
                                               "mt:{n}:card:3", "mt:{n}:res:a", "mt:{n}:res:u"]


async def test_snapshots_of_many_nodes_are_read_in_batches_and_whole(redis_client: Redis) -> None:
    """A read of more nodes than SNAPSHOT_BATCH is cut into round trips of at most that many (each reply is
    decoded while the caller's event loop waits), and returns every node once, cold keys learnt or not."""
    from shared.store.ledger import SNAPSHOT_BATCH

    led = Ledger(redis_client)
    n = 2 * SNAPSHOT_BATCH + 7
    names = [f"b{i:04d}" for i in range(n)]
    for i, name in enumerate(names):
        await led.upsert_node(inventory(name, S5000 if i % 2 else S4000))
    await led.reserve(names[-1], "u", [0], 4, 1, 1)
    await cold(led).snapshots([names[0]])  # the script in Redis's cache (a fresh server loads it: one more trip)
    reader = cold(led)  # knows no key: every node answers MOREKEYS once, then is read again
    before = reader.round_trips
    got = await reader.snapshots([*names, names[0]])  # a name twice: read once
    assert sorted(got) == names and list(got[names[-1]].reservations) == ["u"]
    assert reader.round_trips - before == 2 * 3  # 3 batches, each read again with the keys it learnt
    before = reader.round_trips
    assert (await reader.snapshots(names)).keys() == got.keys()
    assert reader.round_trips - before == 3  # warm: one round trip per batch


@pytest.mark.redis
async def test_a_standalone_redis_has_no_partition_risk_to_report(warm: StrictLedger) -> None:
    """Only a Sentinel master can book while cut off from the replicas one of which is promoted
    (tests/redis_ha/test_partition_risk.py)."""
    assert await warm.partition_risk() == ""
