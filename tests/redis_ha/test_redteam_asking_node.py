"""Red team of the roles' cluster client's ASK path (shared/store/redis_conn.py `_Cluster.get_node`, `_AskingNode`), on
a real Redis Cluster of this module's own:

- a node asked for by name is used by redis-py for more than an ASK: `RedisCluster.scan_iter` asks each node that has
  more to scan by name and passes it back as `target_nodes`, which redis-py accepts only as a ClusterNode (a wrapper
  that is none failed every scan of more than one round with a TypeError);
- a call cancelled while it follows an ASK (a deadline of the caller's, a request that went away) gives its
  connection back to the node's pool, as redis-py's own calls do (a wrapper sending the two through
  `ClusterNode.execute_pipeline` left it out of the pool for good, one connection per cancelled call);
- calls following an ASK to the same node at once each carry their own ASKING (alone, and from a cluster pipeline);
- a node with no booking whose keys moved ahead of its slot has no pods set, so the target, which runs a
  command of several keys only if it holds them all, answers TRYAGAIN for as long as the slot is open: its read is
  refused as a slot moving (`slot_moving`, the mirror leaves it out), as docs/redis-layout.md says."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio.cluster import ClusterNode

from deploy.local.redis import ClusterSetup, RedisServer
from shared.store.ledger import Ledger, connect, slot_moving
from shared.store.redis_conn import _Cluster
from tests.redis.helpers import S4000, inventory
from tests.redis_ha.conftest import own_cluster
from tests.redis_ha.test_reshard_ask import idle_on, moved_ahead

pytestmark = pytest.mark.redis_ha


@pytest.fixture(scope="module")
def setup() -> Iterator[ClusterSetup]:
    with own_cluster() as s:
        yield s


@pytest.fixture
async def led(setup: ClusterSetup, request: pytest.FixtureRequest) -> AsyncIterator[Ledger]:
    ledger = Ledger(connect(setup.url), prefix=f"rt{abs(hash(request.node.name)) % 10**6}")
    await ledger.load_scripts()
    yield ledger
    await ledger.redis.aclose()


def pause(server: RedisServer, ms: int) -> None:
    """Every client of `server` waits `ms` for its next answer (CLIENT PAUSE), the node itself stays up."""
    with server.client() as c:
        c.execute_command("CLIENT", "PAUSE", str(ms), "ALL")


async def test_a_scan_of_several_rounds_is_served(led: Ledger) -> None:
    client = led.redis
    assert isinstance(client, _Cluster)
    keys = {f"{led.keys.prefix}:scan:{i}" for i in range(300)}
    await client.mset_nonatomic(dict.fromkeys(keys, "1"))
    got = [k async for k in client.scan_iter(match=f"{led.keys.prefix}:scan:*", count=10)]
    assert sorted(got) == sorted(keys)


async def test_a_node_asked_by_name_is_the_node_for_redis_py(led: Ledger) -> None:
    client = led.redis
    assert isinstance(client, _Cluster)
    await client.initialize()
    node = client.get_primaries()[0]
    by_name = client.get_node(node_name=node.name)
    assert isinstance(by_name, ClusterNode)
    assert by_name == node and node == by_name and hash(by_name) == hash(node)
    assert client.get_node(node_name=node.name) == by_name  # two lookups of one node are one node
    client.set_default_node(by_name)
    assert await client.execute_command("PING", target_nodes=by_name)


async def test_a_call_cancelled_while_it_follows_an_ask_gives_its_connection_back(setup: ClusterSetup,
                                                                                 led: Ledger) -> None:
    node = "n1"
    await led.upsert_node(inventory(node, S4000))
    assert (await led.reserve(node, "u1", [0], 8, 2, 1, pod="ns/p1"))[0].ok
    key = led.node_key(node)
    slot, dest = await moved_ahead(setup, key)
    try:
        client = led.redis
        assert isinstance(client, _Cluster)
        target = client.get_node(host="127.0.0.1", port=dest.port)
        assert target is not None
        assert await client.hlen(key)  # (followed once: a connection of the target's idle)
        for _ in range(3):
            await asyncio.to_thread(pause, dest, 300)  # the target holds its answer: the call waits on it
            call = asyncio.create_task(client.hlen(key))
            await asyncio.sleep(0.1)
            assert not call.done()
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await call
            await asyncio.sleep(0.3)  # the pause over
        # none in use any more: each connection the target's pool made is idle in it again
        assert sorted(map(id, target._connections)) == sorted(map(id, target._free)), \
            (len(target._connections), len(target._free))
        assert await client.hlen(key)  # and the pool still serves
    finally:
        await asyncio.to_thread(setup.end_move, slot, dest)


async def test_calls_following_an_ask_to_one_node_at_once_each_carry_their_asking(setup: ClusterSetup,
                                                                                 led: Ledger) -> None:
    node = "n2"
    await led.upsert_node(inventory(node, S4000))
    assert (await led.reserve(node, "u1", [0], 8, 2, 1, pod="ns/p1"))[0].ok
    slot, dest = await moved_ahead(setup, led.node_key(node))
    try:
        await idle_on(led, dest, 2)  # the idle count that sent ASKING and the command apart before
        trips = led.round_trips
        snaps = await asyncio.gather(*(led.snapshot(node) for _ in range(12)))
        assert all(s is not None and set(s.reservations) == {"u1"} for s in snaps)
        assert led.round_trips == trips + 12  # each at its first send
        # and in a cluster pipeline (Ledger.snapshots): the source's ASK in its place, followed alone
        await led.upsert_node(inventory("n2b", S4000))
        many = await asyncio.gather(*(led.snapshots([node, "n2b"]) for _ in range(4)))
        assert all(set(m) == {node, "n2b"} and set(m[node].reservations) == {"u1"} for m in many), many
    finally:
        await asyncio.to_thread(setup.end_move, slot, dest)


async def test_a_node_without_bookings_moved_ahead_of_its_slot_is_refused_as_moving(setup: ClusterSetup,
                                                                                  led: Ledger) -> None:
    led.retry_seconds, led.connection_retries = 0.2, 0
    node = "n3"
    await led.upsert_node(inventory(node, S4000))  # no booking: no pods set
    slot, dest = await moved_ahead(setup, led.node_key(node))
    try:
        with pytest.raises(Exception) as caught:
            await led.snapshot(node)
        assert slot_moving(caught.value), repr(caught.value)
    finally:
        await asyncio.to_thread(setup.end_move, slot, dest)
    snap = await led.snapshot(node)  # the move over: read on its new shard
    assert snap is not None and not snap.reservations
