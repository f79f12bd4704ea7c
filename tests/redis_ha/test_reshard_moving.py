"""A node whose keys a live reshard has split between two shards, on a real Redis Cluster, with the roles' own retry
settings: the mirror learns it is moving however it meets the move (a periodic resync reads only node versions, one
key each, which read fine mid-move: a bind's or the janitor's failed script tells it), offers it to no filter, keeps
the other nodes current without spending its retry budget on the moving one, and reads it again later and later
until the move ends (shared/store/mirror.py Mirror.moving, shared/store/ledger_reads.py isolate/apart,
ledger_core.py on_moving).
Found by a red team of the first version, which noticed only the moves its own reads met."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from controller.extender import Extender
from controller.fit_memo import MOVING
from controller.janitor import Janitor
from controller.pod_watch import PodWatcher
from controller.watchers import janitor_for
from deploy.local.redis import ClusterSetup, RedisServer
from shared.kube import Kube, KubeError
from shared.serving.supervise import Supervisor
from shared.store import mirror as mirror_module
from shared.store.ledger import Ledger, connect, connect_subscriber, slot_moving
from shared.store.mirror import Mirror
from tests.redis.helpers import S4000, eventually, inventory
from tests.redis_ha.conftest import own_cluster
from tests.unit._servers import CFG, pod

pytestmark = pytest.mark.redis_ha



def moving_reads_within(seconds: float) -> int:
    """How many reads of a moving node the mirror's schedule (MOVING_RETRY_SECONDS, doubled each time up to
    MOVING_RETRY_MAX_SECONDS) makes at most in `seconds`, from a read at the start."""
    wait, at, n = mirror_module.MOVING_RETRY_SECONDS, 0.0, 0
    while at + wait <= seconds:
        at += wait
        n += 1
        wait = min(mirror_module.MOVING_RETRY_MAX_SECONDS, wait * 2)
    return n

@pytest.fixture(scope="module")
def setup() -> Iterator[ClusterSetup]:
    with own_cluster() as s:
        yield s


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
            first, since = len(reads), time.monotonic()
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
            # read again later and later (1, 2, 4, 8 s ...): over the 10 s or more this took a handful of reads, not
            # one a second; at most as many as that schedule fits in the time it took, however slow the machine,
            # with one at the start and one per periodic resync (every 30 s, which reads the moving node too)
            again = [r for r in reads[first:] if r == ["g7"]]
            took = time.monotonic() - since
            most = 2 + moving_reads_within(took) + int(took // mirror.resync_seconds)
            assert 1 <= len(again) <= most < took, (len(again), most, took)
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


@pytest.mark.parametrize("moved", ["none", "all"])
async def test_a_node_whose_slot_is_open_with_its_keys_together_stays_moving_until_the_move_ends(
        setup: ClusterSetup, moved: str) -> None:
    """The slot is MIGRATING (begin_move) and the node's keys are all on one side: none moved yet, or all moved
    and the slot not yet given away. A snapshot names only keys that exist, so Redis runs it (source, or target
    after ASK). A reserve names the new uid's reservation key, which exists nowhere: Redis answers TRYAGAIN
    (missing keys in a migrating/importing slot) to every booking, for the whole move. Red team round 2: the node
    went in and out of `moving` (failed booking in, read alone fine out, offered, the next booking failed).
    Now a moving node's slot is asked first (Ledger.slot_open): it stays out of every filter until the move ends."""
    node = f"f-{moved}"
    led = Ledger(connect(setup.url))  # the roles' own retry settings
    mirror = Mirror(led)
    cfg = dataclasses.replace(CFG, filter_top_k=0)
    source = setup.owner_of(led.node_key(node))
    dest: RedisServer = next(n for n in setup.nodes if n is not source)
    slot = None
    log: list[str] = []
    try:
        await led.load_scripts()
        await led.upsert_node(inventory(node, S4000))
        assert (await led.reserve(node, "u0", [0], 8, 2, 1))[0].ok  # the node has a reservation key too
        await mirror.resync(full=True)
        mirror.ready.set()
        ext = Extender(cfg, led, mirror, None)
        slot = await asyncio.to_thread(setup.begin_move, led.node_key(node), dest)
        if moved == "all":
            while await asyncio.to_thread(setup.move_keys, slot, dest, 100):
                pass
        failures = 0
        offered_after_failure = 0
        led.retry_seconds, led.connection_retries = 0.2, 0  # (the bookings give up sooner: only for time)
        for i in range(3):
            t0 = time.monotonic()
            try:
                out, _ = await led.reserve(node, f"n{i}", [1], 8, 2, 1)
                log.append(f"reserve n{i}: ok={out.ok} in {time.monotonic() - t0:.2f}s")
                break
            except Exception as e:
                assert slot_moving(e), repr(e)
                failures += 1
                log.append(f"reserve n{i}: {type(e).__name__} {e} after {time.monotonic() - t0:.2f}s; "
                           f"moving={set(mirror.moving)}")
            await mirror.resync(only=mirror.moving)  # the loop's re-read of the moving nodes, 1 s later
            got = ext.filter({"Pod": pod(f"p{i}"), "NodeNames": [node]})
            log.append(f"  after re-read alone: moving={set(mirror.moving)} offered={got['NodeNames']}")
            if got["NodeNames"] == [node]:
                offered_after_failure += 1
        assert (failures, offered_after_failure) == (3, 0), log
        assert mirror.moving == {node}
        await mirror.resync(full=True)  # a full read too: the node's keys read fine, the slot is still open
        assert mirror.moving == {node}, log
        await asyncio.to_thread(setup.end_move, slot, dest)
        slot = None
        await mirror.resync(only=mirror.moving)
        assert not mirror.moving
        assert ext.filter({"Pod": pod("after"), "NodeNames": [node]})["NodeNames"] == [node]
    finally:
        if slot is not None:
            await asyncio.to_thread(setup.end_move, slot, dest)
        await led.redis.aclose()


async def no_such_pod(namespace: str, name: str) -> dict[str, Any]:
    """The API server's answer to the janitor's read of a pod nobody bound (PodWatcher.api_holds): 404."""
    raise KubeError(404, {"message": f"pods \"{name}\" not found"}, f"GET pod {namespace}/{name}")


async def test_the_janitor_sweeps_the_others_when_a_held_back_record_is_on_a_moving_node(setup: ClusterSetup) -> None:
    """Before expire the janitor's sweep asks the pod watcher to send the records it holds back (confirm_now), on
    any node; one on the moving node failed out of the sweep (red team round 2), so no expired booking was freed
    anywhere while the move lasted. Now such a record is held back until the node can be read, and its booking
    kept by the janitor meanwhile."""
    from controller.pod_watch import PodWatcher
    from controller.watchers import janitor_for
    from shared.kube import Kube
    from tests.redis.test_watcher_records import pod as rec_pod

    led = Ledger(connect(setup.url))
    led.retry_seconds, led.connection_retries = 0.2, 0  # (shorter than the roles': only for time)
    mirror = Mirror(led)
    cfg = dataclasses.replace(CFG, pending_ttl_seconds=2)  # bound_grace = 0.5 s
    source = setup.owner_of(led.node_key("n4"))
    dest: RedisServer = next(n for n in setup.nodes if n is not source)
    slot = None
    try:
        await led.load_scripts()
        for n in ("n4", "n5"):
            await led.upsert_node(inventory(n, S4000))
        assert (await led.reserve("n4", "u1", [0], 2, 1, 1, pod="ns/u1"))[0].ok  # our bind; its binder dies
        assert (await led.reserve("n5", "dead", [0], 2, 1, 1, pod="ns/dead"))[0].ok  # no pod: to expire
        await mirror.resync(full=True)
        mirror.ready.set()
        w = PodWatcher(Kube(None), Ledger(led.redis), mirror, cfg, asyncio.Event())  # type: ignore[arg-type]
        w.ledger.retry_seconds, w.ledger.connection_retries = 0.2, 0
        w.ledger.on_moving.append(mirror.note_moving)  # (the role shares one Ledger; here two clients)
        await w.on_event("MODIFIED", rec_pod("u1"))  # u1's record: held back for our bind's confirmation
        assert "u1" in w.deferred, w.deferred
        w.kube.get_pod = no_such_pod  # type: ignore[method-assign]  # the API server, asked before an expiry
        janitor = janitor_for(led, mirror, cfg, w)
        janitor.view_problem = lambda: ""  # the pod view is live (no reflector in this test)
        slot = await asyncio.to_thread(setup.begin_move, led.node_key("n4"), dest)
        assert await asyncio.to_thread(setup.move_keys, slot, dest, 1) == 1
        await asyncio.sleep(2.3)  # dead is past the TTL, u1's record is due
        outcome = []
        for _ in range(2):
            try:
                gone = await janitor.sweep()
                outcome.append(f"swept {gone}")
            except Exception as e:
                outcome.append(f"{type(e).__name__}: {e}")
        snap5 = await led.snapshot("n5")
        assert snap5 is not None
        assert "dead" not in snap5.reservations, outcome
        assert "u1" in w.deferred and mirror.moving == {"n4"}  # held back, its booking kept
        await asyncio.to_thread(setup.end_move, slot, dest)
        slot = None
        await mirror.resync(only=mirror.moving)
        assert not mirror.moving
        await w.confirm_due(now=time.monotonic() + 60)  # sent now that the node can be read
        assert "u1" not in w.deferred
    finally:
        if slot is not None:
            await asyncio.to_thread(setup.end_move, slot, dest)
        await led.redis.aclose()


async def test_a_pod_event_on_a_moving_node_does_not_hold_the_pod_stream(setup: ClusterSetup) -> None:
    """A release (a pod deleted) on the moving node failed out of the pod watcher; the reflector replays an event
    it could not handle, so every later pod event of every node waited for the move's end (red team round 2: a
    pod deleted elsewhere kept its cards). Now the release waits apart (PodWatcher.parked), the stream goes on,
    and the release is made once the node can be read."""
    from controller.pod_watch import PodWatcher
    from controller.reflector import HandlerError
    from shared.kube import Kube
    from tests.redis.test_watcher_records import pod as rec_pod

    led = Ledger(connect(setup.url))
    led.retry_seconds, led.connection_retries = 0.2, 0
    mirror = Mirror(led)
    source = setup.owner_of(led.node_key("n4"))
    dest: RedisServer = next(n for n in setup.nodes if n is not source)
    slot = None
    try:
        await led.load_scripts()
        for n in ("n4", "n6"):
            await led.remove_node(n)  # (n4's keys moved in the test before: made anew on the shard they are on)
            await led.upsert_node(inventory(n, S4000))
        for uid, n in (("a1", "n4"), ("b1", "n6")):
            assert (await led.reserve(n, uid, [0], 2, 1, 1, pod=f"ns/{uid}"))[0].ok
            assert await led.mark_bound(n, uid)
        await mirror.resync(full=True)
        w = PodWatcher(Kube(None), led, mirror, CFG, asyncio.Event())  # type: ignore[arg-type]
        r = w.reflector
        r.resource_version = "10"
        slot = await asyncio.to_thread(setup.begin_move, led.node_key("n4"), dest)
        assert await asyncio.to_thread(setup.move_keys, slot, dest, 1) == 1
        a1 = rec_pod("a1")
        b1 = rec_pod("b1", "n6-mthreads-0,Mthreads,1024,1:;")
        b1["spec"]["nodeName"] = "n6"
        events = [{"type": "DELETED", "object": {**a1, "metadata": {**a1["metadata"], "resourceVersion": "11"}}},
                  {"type": "DELETED", "object": {**b1, "metadata": {**b1["metadata"], "resourceVersion": "12"}}}]
        stuck = []
        for attempt in range(3):  # the watch resumed from r.resource_version replays the same events each time
            for ev in events:
                if int(ev["object"]["metadata"]["resourceVersion"]) <= int(r.resource_version):
                    continue
                try:
                    await r._handle(ev)
                except HandlerError as e:
                    stuck.append(f"attempt {attempt}: {e} (rv stays {r.resource_version})")
                    break
        snap6 = await led.snapshot("n6")
        assert snap6 is not None
        assert not stuck and "b1" not in snap6.reservations, stuck
        assert r.resource_version == "12" and set(w.parked) == {"a1"}
        await asyncio.to_thread(setup.end_move, slot, dest)
        slot = None
        await mirror.resync(only=mirror.moving)
        await w.confirm_due()
        assert not w.parked
        snap4 = await led.snapshot("n4")
        assert snap4 is not None and "a1" not in snap4.reservations
    finally:
        if slot is not None:
            await asyncio.to_thread(setup.end_move, slot, dest)
        await led.redis.aclose()


async def test_a_reconcile_pass_repairs_the_other_nodes_while_one_slot_moves(setup: ClusterSetup) -> None:
    """The reconciler's pass read every node at once and failed on the moving one: no node was repaired until the
    move ended. Now the moving node is left out of the pass (and told to the mirror), the others are compared."""
    from controller.node_watch import NodeWatcher
    from controller.pod_watch import PodWatcher
    from controller.reconciler import Reconciler
    from controller.watchers import wire
    from tests.redis.test_reconcile_touched import CFG as RCFG
    from tests.redis.test_redteam_inflight_nodes import NoKube, gpu_node

    led = Ledger(connect(setup.url))
    led.retry_seconds, led.connection_retries = 0.2, 0
    slot = dest = None
    try:
        await led.load_scripts()
        for n in ("ra", "rb"):
            await led.remove_node(n)
        nodes = NodeWatcher(NoKube(), led, RCFG)  # type: ignore[arg-type]
        for name in ("ra", "rb"):
            await nodes.on_event("ADDED", gpu_node(name))
        pods = PodWatcher(NoKube(), led, Mirror(led), RCFG, nodes.lost)  # type: ignore[arg-type]
        wire(nodes, pods)
        rec = Reconciler(NoKube(), led, RCFG, nodes, pods)  # type: ignore[arg-type]
        # usage on rb's card that no reservation explains (an edit behind the scripts' back)
        await led.redis.hset(led.keys.card("rb", 0), "mem_used", 40)  # type: ignore[misc]
        source = setup.owner_of(led.node_key("ra"))
        dest = next(n for n in setup.nodes if n is not source)
        slot = await asyncio.to_thread(setup.begin_move, led.node_key("ra"), dest)
        assert await asyncio.to_thread(setup.move_keys, slot, dest, 1) == 1
        repaired = await rec.reconcile_all()
        assert repaired, repaired
        assert (await led.snapshot("rb")).cards[0].mem_used == 0  # type: ignore[union-attr]
        assert pods.mirror.moving == {"ra"}
    finally:
        if slot is not None and dest is not None:
            await asyncio.to_thread(setup.end_move, slot, dest)
        await led.redis.aclose()


def plain_pod(uid: str, node: str) -> dict[str, Any]:
    """A pod with no GPU (most pods of a cluster), bound to a node without GPUs (not in the ledger)."""
    return {"metadata": {"name": uid, "namespace": "web", "uid": uid},
            "spec": {"schedulerName": "default-scheduler", "nodeName": node,
                     "containers": [{"name": "c"}]},
            "status": {"phase": "Running"}}


async def test_a_parked_release_on_a_node_the_ledger_does_not_list_waits_for_its_slot_to_close(
        setup: ClusterSetup) -> None:
    """Every pod deletion gives back on the pod's node, GPU node or not. A node the ledger does not list whose slot
    is open refuses it; the release is parked and the node noted moving. Red team round 3: the mirror dropped the
    node from `moving` at its next read (not listed), so every confirm_due (and the janitor's before_expire) sent
    the release again, ~3.4 s each at the roles' retry, for as long as the move lasted. Now such a node stays noted
    while its slot is open (asked alone), and nothing is sent to it until then."""
    led = Ledger(connect(setup.url))  # roles' own retry: retry_seconds 3, connection_retries 2
    mirror = Mirror(led)
    cfg = dataclasses.replace(CFG, pending_ttl_seconds=2)
    web = "web-1"  # no GPU: never in the ledger
    source = setup.owner_of(led.node_key(web))
    dest: RedisServer = next(n for n in setup.nodes if n is not source)
    slot = None
    try:
        await led.load_scripts()
        await led.upsert_node(inventory("g1", S4000))
        assert (await led.reserve("g1", "dead", [0], 2, 1, 1, pod="ns/dead"))[0].ok  # binder died: to expire
        await mirror.resync(full=True)
        mirror.ready.set()
        w = PodWatcher(Kube(None), led, mirror, cfg, asyncio.Event())  # type: ignore[arg-type]
        w.kube.get_pod = no_such_pod  # type: ignore[method-assign]  # the API server, asked before an expiry
        janitor = janitor_for(led, mirror, cfg, w)
        janitor.view_problem = lambda: ""
        slot = await asyncio.to_thread(setup.begin_move, led.node_key(web), dest)
        for i in range(3):
            await w.on_event("DELETED", plain_pod(f"p{i}", web))
        assert set(w.parked) == {"p0", "p1", "p2"} and web in mirror.moving
        for _ in range(2):
            await mirror.resync(only=mirror.moving)  # the mirror's re-read of moving nodes
            assert web in mirror.moving
            before = led.round_trips
            await w.confirm_due()
            assert led.round_trips == before and set(w.parked) == {"p0", "p1", "p2"}  # nothing sent meanwhile
        await asyncio.sleep(2.2)  # "dead" past its (2 s) TTL
        assert await janitor.sweep() == ["dead"]  # the janitor's before_expire sends nothing either
        await asyncio.to_thread(setup.end_move, slot, dest)
        slot = None
        await mirror.resync(only=mirror.moving)
        assert not mirror.moving
        await w.confirm_due()
        assert not w.parked  # given back (nothing was held there)
    finally:
        if slot is not None:
            await asyncio.to_thread(setup.end_move, slot, dest)
        await led.redis.aclose()


async def test_a_record_whose_observe_fails_for_the_move_is_held_back_and_booked_after(
        setup: ClusterSetup) -> None:
    """(Red team round 3, what held) A bound pod's record on a node whose slot moves, with no booking in the mirror:
    the observe fails for the move, the node is noted moving, the record is deferred (not dropped), the janitor
    keeps nothing it should not, and confirm_due books it once the node can be read; a re-created pod (same name,
    new uid) after a parked release is not affected."""
    from tests.redis.test_watcher_records import pod as rec_pod

    led = Ledger(connect(setup.url))
    led.retry_seconds, led.connection_retries = 0.2, 0
    mirror = Mirror(led)
    node = "n4"
    source = setup.owner_of(led.node_key(node))
    dest: RedisServer = next(n for n in setup.nodes if n is not source)
    slot = None
    try:
        await led.load_scripts()
        await led.remove_node(node)
        await led.upsert_node(inventory(node, S4000))
        assert (await led.reserve(node, "old", [0], 2, 1, 1, pod="ns/r1"))[0].ok
        assert await led.mark_bound(node, "old")
        await mirror.resync(full=True)
        w = PodWatcher(Kube(None), led, mirror, CFG, asyncio.Event())  # type: ignore[arg-type]
        slot = await asyncio.to_thread(setup.begin_move, led.node_key(node), dest)
        assert await asyncio.to_thread(setup.move_keys, slot, dest, 1) == 1
        await w.on_event("MODIFIED", rec_pod("rec"))  # a record nobody booked: observe fails for the move
        assert "rec" in w.deferred and node in mirror.moving, (w.deferred, mirror.moving)
        old = rec_pod("old")
        await w.on_event("DELETED", old)  # old pod r1 deleted: parked
        assert set(w.parked) == {"old"}
        new = rec_pod("new")  # the same name again, a new uid
        new["metadata"]["name"] = "old"
        await w.on_event("MODIFIED", new)
        assert "new" in w.deferred and set(w.parked) == {"old"}
        for _ in range(2):
            await w.confirm_due(now=time.monotonic() + 60)
            assert {"rec", "new"} <= set(w.deferred) and set(w.parked) == {"old"}
        await asyncio.to_thread(setup.end_move, slot, dest)
        slot = None
        await mirror.resync(only=mirror.moving)
        assert not mirror.moving
        await w.confirm_due(now=time.monotonic() + 60)
        snap = await led.snapshot(node)
        assert snap is not None
        assert not w.parked and "old" not in snap.reservations
        assert {"rec", "new"} <= set(snap.reservations) and not ({"rec", "new"} & set(w.deferred))
    finally:
        if slot is not None:
            await asyncio.to_thread(setup.end_move, slot, dest)
        await led.redis.aclose()
