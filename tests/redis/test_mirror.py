"""The mirror: a replica's copy of the ledger, kept current by the feed (real Redis, real Pub/Sub)."""

from __future__ import annotations

import asyncio
import dataclasses

import orjson
import pytest
from prometheus_client import REGISTRY
from redis.asyncio import Redis

from deploy.local.redis import RedisServer
from shared.domain.annotations import PodUsage
from shared.domain.state import CardRecord, NodeSnapshot
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis.conftest import MirrorFactory
from tests.redis.helpers import S4000, S5000, eventually, inventory


async def in_sync(m: Mirror, led: Ledger) -> bool:
    return m.nodes == await led.snapshots(await led.nodes())


async def wait_synced(m: Mirror, led: Ledger, what: str = "mirror equals the ledger") -> None:
    await eventually(lambda: in_sync(m, led), what=what)


def full_reads(*whys: str) -> float:
    """mtsched_mirror_full_reads_total summed over these whys (process-wide: compare before and after)."""
    return sum(REGISTRY.get_sample_value("mtsched_mirror_full_reads_total", {"why": w}) or 0.0 for w in whys)


def rereads(why: str) -> float:
    """mtsched_mirror_rereads_total{why} as /metrics shows it (process-wide: compare before and after)."""
    return REGISTRY.get_sample_value("mtsched_mirror_rereads_total", {"why": why}) or 0.0


@pytest.mark.redis
async def test_mirror_applies_the_feed_in_order(cluster: Ledger, mirror_factory: MirrorFactory) -> None:
    led = cluster
    m = await mirror_factory()
    assert await in_sync(m, led) and m.refetches == 0
    changed: list[str] = []
    m.on_change.append(changed.append)
    steps = [
        lambda: led.reserve("n4", "u1", [0], 8, 2, 1, pod="ns/p1"),
        lambda: led.mark_bound("n4", "u1"),
        lambda: led.reserve("n5", "u2", [0, 1], S5000, 16, 1, model=S5000, whole=True),
        lambda: led.observe("u3", PodUsage("n4", (1,), 16, 4, 2), "ns/p3"),
        lambda: led.release("n5", "u2"),
        lambda: led.upsert_node(inventory("n4", S4000, indices=[1])),  # card 0 removed while u1 holds it
        lambda: led.release("n4", "u1"),
        lambda: led.upsert_node(inventory("n6", S5000, 1)),  # a new node: read (maybe another database's message)
    ]
    for step in steps:
        await step()
    await wait_synced(m, led)
    assert m.refetches == 1  # every change arrived in order and was applied from its message; the new node read
    assert m.applied == len(steps) - 1
    assert changed == ["n4", "n4", "n5", "n4", "n5", "n4", "n4", "n6"]
    assert sorted(m.get("n4").cards) == [1]  # type: ignore[union-attr]
    assert list(m.get("n4").reservations) == ["u3"]  # type: ignore[union-attr]


@pytest.mark.redis
async def test_mirror_refetches_a_node_after_a_gap(cluster: Ledger, mirror_factory: MirrorFactory) -> None:
    led = cluster
    m = await mirror_factory()
    m.nodes["n4"] = dataclasses.replace(m.nodes["n4"], version=m.nodes["n4"].version - 1)  # as if one message
    # had been lost
    gaps = rereads("gap")
    await led.reserve("n4", "u1", [0], 8, 2, 1)
    await wait_synced(m, led)
    assert m.refetches == 1 and rereads("gap") == gaps + 1
    assert "u1" in m.nodes["n4"].reservations


@pytest.mark.redis
async def test_mirror_refetches_an_unknown_node(cluster: Ledger, mirror_factory: MirrorFactory) -> None:
    led = cluster
    m = await mirror_factory()
    del m.nodes["n5"]  # e.g. it was added while this replica was reading
    unknown = rereads("unknown")
    await led.reserve("n5", "u1", [1], 8, 2, 1)
    await wait_synced(m, led)
    assert m.refetches == 1 and rereads("unknown") == unknown + 1


@pytest.mark.redis
async def test_mirror_refetches_after_a_rebuild_and_drops_removed_nodes(
        populated: Ledger, mirror_factory: MirrorFactory) -> None:
    led = populated
    m = await mirror_factory()
    assert sorted(m.nodes) == ["n4", "n5", "nerr", "nx"]
    bound = {"b1": (PodUsage("n4", (0,), 8, 2, 1), "ns/b1")}
    rebuilds = rereads("rebuild")
    await led.rebuild([inventory("n4", S4000), inventory("n5", S5000)], bound)
    await wait_synced(m, led)
    assert sorted(m.nodes) == ["n4", "n5"]
    assert m.refetches == 2  # one per rebuilt node; removed nodes need no read
    assert rereads("rebuild") == rebuilds + 2
    assert "b1" in m.nodes["n4"].reservations


@pytest.mark.redis
async def test_mirror_sees_a_node_recreated_after_removal(cluster: Ledger, mirror_factory: MirrorFactory) -> None:
    led = cluster
    m = await mirror_factory()
    for i in range(3):
        await led.reserve("n4", f"u{i}", [0], 2, 1, 1)
    await wait_synced(m, led)
    await led.remove_node("n4")
    await led.upsert_node(inventory("n4", S5000, 1))  # back with version 1 and other cards
    await wait_synced(m, led)
    assert m.nodes["n4"].version == 1 and m.nodes["n4"].reservations == {}


@pytest.mark.redis
async def test_mirror_survives_malformed_feed_messages(cluster: Ledger, mirror_factory: MirrorFactory) -> None:
    led = cluster
    m = await mirror_factory()
    v = m.nodes["n4"].version
    junk = ["garbage", "[]", "42", '{"x": 1}', '{"node": 5, "version": 1}', '{"node": "n4", "version": "abc"}',
            orjson.dumps({"node": "n4", "version": v + 1, "kind": "reserve", "cards": {"0": {"capacity": "x"}}}),
            orjson.dumps({"node": "n4", "version": v + 1, "kind": "reserve", "cards": {},
                          "uid": "evil", "res": {"cards": "0"}})]
    for raw in junk:
        await led.redis.publish(led.feed, raw)
    await led.reserve("n4", "u1", [0], 8, 2, 1)
    await wait_synced(m, led, "the mirror keeps working after junk on the feed")
    assert "evil" not in m.nodes["n4"].reservations
    assert m._task is not None and not m._task.done()


@pytest.mark.redis
async def test_mirror_capacities_and_owner_of(populated: Ledger, mirror_factory: MirrorFactory) -> None:
    led = populated
    m = await mirror_factory()
    assert m.capacities() == {S4000, S5000}  # nerr offers no card
    await led.observe("u8", PodUsage("n4", (7,), 8, 1, 1))  # a placeholder card (capacity 8, "removed")
    await wait_synced(m, led)
    assert 7 in m.nodes["n4"].cards and m.capacities() == {S4000, S5000}
    assert m.owner_of("u3") == "n5" and m.owner_of("u8") == "n4" and m.owner_of("nobody") is None
    # the node the pod is bound to is looked at first; a wrong or unknown one does not mislead
    assert m.owner_of("u3", "n5") == "n5" and m.owner_of("u3", "n4") == "n5" and m.owner_of("u3", "gone") == "n5"
    assert m.owner_of("nobody", "n4") is None
    await led.release("n5", "u3")
    await eventually(lambda: m.owner_of("u3") is None, what="released reservation leaves the mirror")
    await led.remove_node("n5")
    await eventually(lambda: m.capacities() == {S4000}, what="capacities follow removed nodes")


@pytest.mark.redis
@pytest.mark.parametrize("client_retries", [False, True], ids=["client-without-retries", "client-with-retries"])
async def test_mirror_resyncs_after_a_redis_restart(redis_server: RedisServer, redis_client: Redis,
                                                    client_retries: bool) -> None:
    """A restart loses every key and every message in between; the mirror must notice either way.

    A client built with Redis(host, port) retries by default: its Pub/Sub connection reconnects and
    resubscribes silently, so the mirror must learn of it from the connection, not from an error.
    """
    led = Ledger(redis_client)
    await led.upsert_node(inventory("n4", S4000))
    await led.upsert_node(inventory("n5", S5000))
    for i in range(4):
        await led.reserve("n4", f"u{i}", [0], 2, 1, 1)
    sub = (Redis(host="127.0.0.1", port=redis_server.port, password=redis_server.password, decode_responses=True)
           if client_retries
           else Redis.from_url(redis_server.url, decode_responses=True))
    own = Redis.from_url(redis_server.url, decode_responses=True)
    m = Mirror(Ledger(own), subscriber=sub, resync_seconds=300)  # the periodic resync is not what saves us
    first: list[int] = []
    m.on_first_sync.append(lambda: first.append(len(m.nodes)))  # the roles freeze their state there
    started, again = full_reads("start"), full_reads("lost", "reconnected")
    await m.start()
    try:
        await asyncio.wait_for(m.ready.wait(), 10)
        await wait_synced(m, led)
        assert m.nodes["n4"].version == 5
        assert first == [2]  # once, with the nodes read
        assert full_reads("start") == started + 1 and full_reads("lost", "reconnected") == again
        await asyncio.to_thread(redis_server.restart)
        await eventually(lambda: m.nodes == {}, what="the mirror sees the empty Redis after a restart")
        # after the restart versions start over: a fresh node at version 1..2 is newer than the old 5
        await led.upsert_node(inventory("n4", S4000))
        await led.reserve("n4", "after", [1], 4, 1, 1)
        await wait_synced(m, led)
        assert m.nodes["n4"].version == 2 and list(m.nodes["n4"].reservations) == ["after"]
        assert m.ready.is_set()
        assert first == [2]  # a re-read after losing Redis is not a first sync
        # ... and is counted as one, whichever way the client found the new connection
        assert full_reads("start") == started + 1 and full_reads("lost", "reconnected") >= again + 1
    finally:
        await m.stop()
        await sub.aclose()
        await own.aclose()


@pytest.mark.redis
async def test_mirror_apply_rules() -> None:
    """The version rules on plain messages (no Redis needed, but kept with the other mirror tests)."""
    m = Mirror(Ledger(Redis()))
    card = {"capacity": 96, "mem_used": 0, "mem_free": 96, "cores": 16, "cores_used": 0, "cores_free": 16,
            "slices": 0, "slice_limit": 16, "health": "ok"}
    # a new node is read, not built from its message (which may be another database's: the feed channel is shared)
    assert m.apply({"node": "a", "version": 1, "kind": "node", "cards": {"0": card}}) == "a"
    m.put(NodeSnapshot("a", 1, cards={0: CardRecord.from_json(0, card)}))  # as the read found it
    assert m.apply({"node": "a", "version": 1, "kind": "node", "cards": {}}) is None  # duplicate: ignored
    assert m.nodes["a"].version == 1 and list(m.nodes["a"].cards) == [0]
    assert m.apply({"node": "a", "version": 3, "kind": "reserve", "cards": {}}) == "a"  # gap
    assert m.apply({"node": "b", "version": 4, "kind": "reserve", "cards": {}}) == "b"  # unknown node
    assert m.apply({"node": "a", "version": 2, "kind": "rebuild", "cards": {}}) == "a"  # rebuild: re-read
    res = {"cards": "0", "mem": 8, "cores": 2, "slices": 1, "state": "pending", "created": 1}
    assert m.apply({"node": "a", "version": 2, "kind": "reserve", "cards": {"0": card}, "uid": "u", "res": res}) \
        is None
    assert m.owner_of("u") == "a"
    # partial messages merge: only the cards sent change, false removes a card
    card1 = dict(card, mem_used=8, mem_free=88)
    assert m.apply({"node": "a", "version": 3, "kind": "reserve", "full": False, "cards": {"1": card1}}) is None
    assert sorted(m.nodes["a"].cards) == [0, 1] and m.nodes["a"].cards[1].mem_used == 8
    assert m.apply({"node": "a", "version": 4, "kind": "release", "full": False, "cards": {"0": False}}) is None
    assert sorted(m.nodes["a"].cards) == [1]
    assert m.apply({"node": "a", "version": 5, "kind": "node", "full": True, "cards": {"0": card}}) is None
    assert sorted(m.nodes["a"].cards) == [0]  # full: replaces
    # recreated (version 1 again): ours is stale
    assert m.apply({"node": "a", "version": 1, "kind": "node", "cards": {}}) == "a"
    assert m.apply({"node": "a", "version": 9, "kind": "removed"}) is None  # (an earlier release's: no prev)
    assert m.nodes == {}
    # a removal is taken only onto the write it follows: another one (another database's node of that name) is read
    m.put(NodeSnapshot("a", 2, stamp="2.0"))
    assert m.apply({"node": "a", "version": 3, "kind": "removed", "prev": "1.0"}) == "a" and "a" in m.nodes
    assert m.apply({"node": "a", "version": 3, "kind": "removed", "prev": "2.0"}) is None and m.nodes == {}
    with pytest.raises(ValueError):
        m.apply({"node": "", "version": 1})
    with pytest.raises(KeyError):
        m.apply({"version": 1})
