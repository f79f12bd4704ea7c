"""A node whose keys a live reshard has split between two shards, on a real Redis Cluster, with the roles' own retry
settings: the mirror learns it is moving however it meets the move (a periodic resync reads only node versions, one
key each, which read fine mid-move: a bind's or the janitor's failed script tells it), offers it to no filter, keeps
the other nodes current without spending its retry budget on the moving one, and reads it again later and later
until the move ends (shared/store/mirror.py Mirror.moving, shared/store/ledger.py isolate/apart/on_moving).
Found by a red team of the first version, which noticed only the moves its own reads met."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Iterator

import pytest

from controller.extender import Extender
from controller.fit_memo import MOVING
from controller.watchers import Janitor
from deploy.local.redis import ClusterSetup, RedisServer
from shared.serving.supervise import Supervisor
from shared.store import mirror as mirror_module
from shared.store.ledger import Ledger, connect, connect_subscriber, slot_moving
from shared.store.mirror import Mirror
from tests.redis.helpers import S4000, eventually, inventory
from tests.redis_ha.conftest import PASSWORD
from tests.unit._servers import CFG, pod

pytestmark = pytest.mark.redis_ha


@pytest.fixture(scope="module")
def setup() -> Iterator[ClusterSetup]:
    s = ClusterSetup(password=PASSWORD).start()
    try:
        yield s
    finally:
        s.cleanup()


@contextlib.asynccontextmanager
async def split(setup: ClusterSetup, led: Ledger, node: str) -> AsyncIterator[int]:
    """The node's keys split between two shards (a live reshard held half-way) until the block ends."""
    source = setup.owner_of(led.node_key(node))
    dest: RedisServer = next(n for n in setup.nodes if n is not source)
    slot = await asyncio.to_thread(setup.begin_move, led.node_key(node), dest)
    assert await asyncio.to_thread(setup.move_keys, slot, dest, 1) == 1
    try:
        yield slot
    finally:
        await asyncio.to_thread(setup.end_move, slot, dest)


async def test_a_split_node_nobody_read_is_learnt_from_a_failed_script_and_the_janitor_sweeps_the_others(
        setup: ClusterSetup) -> None:
    role = Ledger(connect(setup.url))  # one role's ledger, shared by its mirror, its binds and its janitor
    role.retry_seconds, role.connection_retries = 0.2, 0  # (gives up sooner; the roles' own: the next test)
    mirror = Mirror(role)
    cfg = dataclasses.replace(CFG, pending_ttl_seconds=1)
    try:
        await role.load_scripts()
        for n in ("d1", "d2"):
            await role.upsert_node(inventory(n, S4000))
        for n in ("d1", "d2"):  # binders that died: past the (1 s) pending TTL, for the janitor
            assert (await role.reserve(n, f"old-{n}", [0], 8, 2, 1, pod=f"ns/old-{n}"))[0].ok
        await asyncio.sleep(1.2)
        await mirror.resync(full=True)
        mirror.ready.set()  # (what Mirror.run sets after its first full read)
        ext = Extender(cfg, role, mirror, None)
        name = "d1"  # split; d2 stays where it is
        async with split(setup, role, name):
            await mirror.resync()  # periodic: versions only, which read fine mid-move
            assert name not in mirror.moving  # (not yet known: what the red team found)
            with pytest.raises(Exception) as booked:  # a bind's booking there fails for the move ...
                await role.reserve(name, "new", [1], 8, 2, 1)
            assert slot_moving(booked.value), repr(booked.value)
            assert mirror.moving == {name}  # ... and tells the mirror
            got = ext.filter({"Pod": pod("u1"), "NodeNames": ["d1", "d2"]})
            assert got["NodeNames"] == ["d2"], got
            ext2 = Extender(dataclasses.replace(cfg, filter_top_k=0), role, mirror, None)
            got = ext2.filter({"Pod": pod("u2"), "NodeNames": ["d1"]})
            assert got["NodeNames"] == [] and got["FailedAndUnresolvableNodes"] == {"d1": MOVING}, got
            mirror.moving = frozenset()  # as if not known: the janitor's own failure on it is read around
            gone = await Janitor(role, mirror, cfg).sweep()
            assert gone == ["old-d2"], gone  # the other node swept, no error
            assert mirror.moving == {name}  # and told again
        await mirror.resync(only=mirror.moving)  # the move ended: read again, offered again
        assert not mirror.moving
        assert ext.filter({"Pod": pod("u3"), "NodeNames": ["d1"]})["NodeNames"] == ["d1"]
    finally:
        await role.redis.aclose()


async def test_with_the_roles_retry_the_others_stay_current_and_the_moving_node_costs_no_retry_budget(
        setup: ClusterSetup, caplog: pytest.LogCaptureFixture) -> None:
    led = Ledger(connect(setup.url))  # another replica's bookings
    mled = Ledger(connect(setup.url))  # the mirror's role: Ledger's own retry settings, as in the roles
    mirror = Mirror(mled, subscriber=connect_subscriber(setup.url))
    names = [f"g{i}" for i in range(60)]
    sup = Supervisor()
    reads: list[list[str]] = []
    real = mled.reread

    async def counting(nodes: list[str], previous: dict[str, int], isolate: bool = False,
                       apart: object = ()) -> object:
        reads.append(list(nodes))
        return await real(nodes, previous, isolate, apart)  # type: ignore[arg-type]

    mled.reread = counting  # type: ignore[method-assign,assignment]
    try:
        await led.load_scripts()
        for n in names:
            await led.upsert_node(inventory(n, S4000))
        async with split(setup, led, "g7"):
            sup.spawn("mirror", mirror.run)
            await asyncio.wait_for(mirror.ready.wait(), 30)
            await eventually(lambda: mirror.moving == {"g7"}, within=30, what="g7 moving")
            caplog.clear()
            caplog.set_level(logging.WARNING, logger="mtsched.ledger")
            first = len(reads)
            # what a resync costs meanwhile (another role's mirror, so that no loop reads in between): the first
            # meets the move in a batch and reads that batch node by node; once the node is known to be moving
            # it is read alone, once (redis-py retried it already), and the other 59 in one round trip, never
            # sent again; a periodic one reads the node list, the versions and the moving node
            other = Ledger(connect(setup.url))
            try:
                probe = Mirror(other)
                await probe.resync(full=True)
                assert probe.moving == {"g7"}
                for full, trips in ((True, 3), (False, 3)):
                    before = other.round_trips
                    await probe.resync(full=full)
                    assert (other.round_trips - before, probe.moving) == (trips, {"g7"}), full
            finally:
                await other.redis.aclose()
            for i in range(40):  # another replica books and gives back on a node that is not moving
                out, _ = await led.reserve("g1", f"b{i}", [i % 2], 1, 0, 1)
                assert out.ok
                await led.release("g1", f"b{i}")
                await asyncio.sleep(0.25)
            written = (await led.snapshot("g1")).version  # type: ignore[union-attr]

            async def current() -> bool:
                assert not sup.failed.is_set(), sup.fatal
                assert mirror.ready.is_set()  # ready throughout
                return mirror.nodes["g1"].version >= written

            await eventually(current, within=30, what="the mirror current on a node that is not moving")
            assert mirror.moving == {"g7"}
            # read again later and later (1, 2, 4, 8 s ...): over ~10 s a handful of reads, not one a second
            again = [r for r in reads[first:] if r == ["g7"]]
            assert 1 <= len(again) <= 5, len(again)
            assert mirror._moving_wait > mirror_module.MOVING_RETRY_SECONDS
            # the moving node never made the mirror send a read again (its retry budget: Redis unavailable only)
            assert not [r for r in caplog.records if "sending again" in r.getMessage()
                        and r.getMessage().startswith(("snapshots", "heads"))], caplog.text[-2000:]

        async def in_sync() -> bool:
            assert not sup.failed.is_set(), sup.fatal
            now = await led.snapshots(names)  # (the module's cluster also holds the first test's nodes)
            return not mirror.moving and {n: mirror.nodes.get(n) for n in names} == now

        await eventually(in_sync, within=30, what="the mirror in sync once the move ended")
    finally:
        await sup.cancel()
        for c in (led, mled):
            await c.redis.aclose()
