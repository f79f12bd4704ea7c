"""Keys a live reshard moved ahead of their slot, on a real Redis Cluster: while the slot is still open (MIGRATING on
the source, IMPORTING on the target), the source answers ASK for a key it no longer has, and the roles' cluster
client reads and writes it on the target, whatever the client did before (docs/redis-layout.md, "Sentinel and
Cluster"). The moved node is read, a bind confirmed, a booking sent again answered as the one it holds (never
booked twice), a booking given back, and the node list (`<prefix>:nodes`, one key) read and written, each at its
first send.

redis-py 7.4.1's asyncio cluster client sent the ASKING that must come first on one pooled connection of the
target and the command on another (its ClusterNode takes the oldest idle connection and gives each back last):
with an even number of connections idle there the command never carried ASKING, the target answered MOVED back to
the source, which answered ASK again, 8 times each, until redis-py's 16 redirects ran out (ClusterError "TTL
exhausted."), at every resend of the ledger, for as long as the slot stayed open. How many connections are idle
depends on how many calls the role made at once before: here they are made so (`idle`), as a role's concurrent
binds and reads do (shared/store/redis_conn.py _AskingNode)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest

from deploy.local.redis import ClusterSetup, RedisServer
from shared.store.ledger import Ledger, connect
from shared.store.redis_conn import _Cluster
from tests.redis.helpers import S4000, all_violations, inventory
from tests.redis_ha.conftest import own_cluster

pytestmark = pytest.mark.redis_ha


@pytest.fixture(scope="module")
def setup() -> Iterator[ClusterSetup]:
    with own_cluster() as s:
        yield s


@pytest.fixture
async def led(setup: ClusterSetup, request: pytest.FixtureRequest) -> AsyncIterator[Ledger]:
    """A ledger with the roles' own retry settings, under a prefix of this test's own."""
    ledger = Ledger(connect(setup.url), prefix=f"ask{abs(hash(request.node.name)) % 10**6}")
    await ledger.load_scripts()
    yield ledger
    await ledger.redis.aclose()


async def idle_on(led: Ledger, server: RedisServer, n: int) -> None:
    """`n` connections of the ledger's client to `server` idle in its pool: `n` calls to it at once."""
    client = led.redis
    assert isinstance(client, _Cluster)
    node = client.get_node(host="127.0.0.1", port=server.port)
    assert node is not None
    await asyncio.gather(*(client.execute_command("PING", target_nodes=node) for _ in range(n)))
    assert len(node._connections) == n, len(node._connections)


async def moved_ahead(setup: ClusterSetup, key: str) -> tuple[int, RedisServer]:
    """`key`'s slot opened towards another primary and every key of it moved there, the slot not given away."""
    source = setup.owner_of(key)
    dest = next(n for n in setup.nodes[:setup.masters] if n is not source)
    slot = await asyncio.to_thread(setup.begin_move, key, dest)
    while await asyncio.to_thread(setup.move_keys, slot, dest, 100):
        pass
    assert await asyncio.to_thread(setup.owner_of, key) is source  # (the slot still the source's)
    return slot, dest


@pytest.mark.parametrize("idle", [1, 2, 3, 4])
async def test_a_node_moved_ahead_of_its_slot_is_read_and_its_bookings_answered(setup: ClusterSetup, led: Ledger,
                                                                              idle: int) -> None:
    node = "n1"
    await led.upsert_node(inventory(node, S4000))
    first, _ = await led.reserve(node, "u1", [0], 8, 2, 1, pod="ns/p1")
    held, _ = await led.reserve(node, "u2", [1], 8, 2, 1, pod="ns/p2")
    ends, _ = await led.reserve(node, "u3", [1], 8, 2, 1, pod="ns/p3")
    assert first.ok and held.ok and ends.ok
    # (no pod has ended on the node yet: its tombstones' hash holds none, and exists all the same, made with the
    # node; a key named and missing there is refused while the slot moves)
    slot, dest = await moved_ahead(setup, led.node_key(node))
    try:
        await idle_on(led, dest, idle)
        trips = led.round_trips
        snap = await led.snapshot(node)  # ASK, then the read on the target
        assert snap is not None and set(snap.reservations) == {"u1", "u2", "u3"}, snap
        assert await led.mark_bound_many(node, ["u1"]) == []  # a bind confirmed
        # a booking sent again (its reply lost): answered as the one it holds, not booked twice
        again, _ = await led.reserve(node, "u1", [0], 8, 2, 1, pod="ns/p1")
        assert again.ok and again.existing and again.cards == (0,), again
        assert await led.release(node, "u2")  # a booking given back
        assert await led.release(node, "u3", ended=True)  # a pod's end: released and tombstoned
        assert led.round_trips == trips + 5, led.round_trips - trips  # each at its first send: nothing resent
    finally:
        await asyncio.to_thread(setup.end_move, slot, dest)
    after = await led.snapshot(node)
    assert after is not None and set(after.reservations) == {"u1"}, after
    assert after.reservations["u1"].state == "bound" and after.reservations["u1"].cards == (0,), after
    assert not all_violations({node: after})
    assert sum(s.memory_used for s in after.states()) == 8, after.states()  # u1 counted once
    assert await led.redis.hget(led.keys.ended(node), "u3") is not None  # type: ignore[misc]


@pytest.mark.parametrize("idle", [1, 2])
async def test_the_node_list_moved_ahead_of_its_slot_is_read_and_written(setup: ClusterSetup, led: Ledger,
                                                                         idle: int) -> None:
    for n in ("a", "b"):
        await led.list_node(n)
    slot, dest = await moved_ahead(setup, led.nodes_key)
    try:
        await idle_on(led, dest, idle)
        trips = led.round_trips
        assert await led.nodes() == ["a", "b"]
        assert await led.list_node("c") == 1
        assert await led.nodes() == ["a", "b", "c"]
        assert led.round_trips == trips + 3, led.round_trips - trips
    finally:
        await asyncio.to_thread(setup.end_move, slot, dest)
    assert await led.nodes() == ["a", "b", "c"]
