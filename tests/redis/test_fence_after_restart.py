"""No new booking on a node until it is compared with the API server after Redis's process changed.

A Redis that restarts from an older snapshot (or a replica promoted by a failover, which replicates
asynchronously) may lack the last bookings it acknowledged: a running pod's cards then look free, and
`intact()` sees nothing (the epoch is there). Before, a reserve in the window until the watchers' next
pass booked those cards again (docs/redis-layout.md said "Until then a card can be booked twice").
Now each node carries the run id of the Redis process it was last compared in (`run`, set by
replace_node); the reserve script refuses a node whose `run` is not the running process's, the
extender asks the watchers to compare it (a `verify` notice), and the reconciler's pass rewrites it
from the API's truth. A real redis-server is restarted from its own RDB file here; the API server is a
stand-in that lists the nodes and pods.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, NamedTuple

import pytest
from prometheus_client import REGISTRY
from redis.asyncio import Redis

from controller.extender import Extender
from controller.node_watch import NodeWatcher
from controller.pod_watch import PodWatcher
from controller.reconciler import Reconciler
from controller.watchers import wire
from deploy.local.redis_server import RedisServer
from shared.domain.node import Card, Inventory
from shared.store.ledger import UNVERIFIED, Ledger, LedgerError
from shared.store.mirror import Mirror
from tests.redis.test_extender_bind import CFG, FakeKube, pod
from tests.redis.test_redteam_heal_bound_pending import ApiWithPods
from tests.redis.test_redteam_inflight_nodes import bound_pod, gpu_node
from tests.redis.test_redteam_rebuild_race import role

pytestmark = pytest.mark.redis


@pytest.fixture
async def server() -> AsyncIterator[RedisServer]:
    s = RedisServer().start()  # its own: this test restarts it from its RDB file
    yield s
    s.cleanup()


def nodes_verified() -> float:
    """mtsched_nodes_verified_total as /metrics shows it (process-wide: compare before and after)."""
    return REGISTRY.get_sample_value("mtsched_nodes_verified_total") or 0.0


async def restart_from_snapshot(server: RedisServer, client: Redis) -> None:
    """Crash Redis and start it again on its last RDB file (written by SAVE): what was written after is lost."""
    server.kill()
    server.start()
    await client.connection_pool.disconnect()


class Started(NamedTuple):
    client: Redis
    ledger: Ledger
    api: ApiWithPods
    nodes: NodeWatcher
    pods: PodWatcher
    rec: Reconciler


async def started(server: RedisServer) -> Started:
    """The watchers' parts on node a of `server`, their views live, after their start-up rebuild."""
    client = Redis.from_url(server.url, decode_responses=True)
    ledger = Ledger(client)
    api = ApiWithPods([gpu_node("a")], [])
    nodes, pods, rec = await role(ledger, api)
    nodes.reflector.synced.set()
    pods.reflector.synced.set()
    await rec.rebuild("start")
    return Started(client, ledger, api, nodes, pods, rec)


async def test_a_booking_lost_by_a_restart_is_not_given_away_before_the_node_is_compared(server: RedisServer) -> None:
    client = Redis.from_url(server.url, decode_responses=True)
    ledger = Ledger(client)
    try:
        p = bound_pod("p", "a", 0, 64 * 512, 12)  # 64 of card 0's 96 units, with its record
        api = ApiWithPods([gpu_node("a")], [])
        nodes, pods, rec = await role(ledger, api)
        nodes.reflector.synced.set()
        pods.reflector.synced.set()
        await rec.rebuild("start")
        assert (await ledger.snapshot("a")).verified  # type: ignore[union-attr]
        await client.save()  # the snapshot Redis will come back with: node a, nothing booked
        # our bind: booked, bound, the Binding written; the watcher sees the pod with its record
        assert (await ledger.reserve("a", "p", [0], 64, 12, 1, pod="ns/p"))[0].ok
        assert await ledger.mark_bound("a", "p")
        api.pods.append(p)
        await pods.on_event("ADDED", p)

        await restart_from_snapshot(server, client)
        assert await ledger.intact()  # the epoch came back with the snapshot: no rebuild is due
        snap = await ledger.snapshot("a")
        assert snap is not None and "p" not in snap.reservations and not snap.verified
        # another pod's bind for the same card: it would fit in the restored ledger (64 + 64 > 96 in truth)
        refused, _ = await ledger.reserve("a", "q", [0], 64, 12, 1, pod="ns/q")
        assert not refused.ok and refused.refused.startswith(UNVERIFIED), refused
        assert not (await ledger.reserve("a", "q", [1], 8, 2, 1, pod="ns/q"))[0].ok  # the node, not a card

        rec.keep_ms = 400  # the keep window (10 s in the role), shortened
        repaired = await rec.reconcile_all()  # the watchers' pass after the reconnect
        assert repaired.get("unverified") == 1 and repaired.get("missing_holder") == 1, repaired
        snap = await ledger.snapshot("a")
        # written from the truth at once, but verified only a keep window after the first comparison (a bind in
        # flight at the restart, its booking lost, is in the API by then), which the pass scheduled
        assert snap is not None and not snap.verified and snap.reservations["p"].state == "bound"
        assert (await ledger.reserve("a", "q", [1], 8, 2, 1, pod="ns/q"))[0].refused.startswith(UNVERIFIED)
        await asyncio.wait_for(rec._touch.wait(), 5)  # what the reconciler's loop waits on
        assert rec.touched == {"a"}
        verified = nodes_verified()
        assert await rec.reconcile_nodes({"a"}) == {"unverified": 1}
        assert nodes_verified() == verified + 1  # mtsched_nodes_verified_total: said once, by the write that did it
        snap = await ledger.snapshot("a")
        assert snap is not None and snap.verified and snap.reservations["p"].state == "bound"
        refused, _ = await ledger.reserve("a", "q", [0], 64, 12, 1, pod="ns/q")
        assert not refused.ok and not refused.refused.startswith(UNVERIFIED)  # p holds it: too little left
        assert (await ledger.reserve("a", "q", [1], 64, 12, 1, pod="ns/q"))[0].ok
        assert not (await rec.reconcile_all())  # verified and equal to the truth: nothing to repair
        assert nodes_verified() == verified + 1
    finally:
        await client.aclose()


async def test_a_bind_refused_on_an_unverified_node_asks_the_watchers_to_compare_it(server: RedisServer) -> None:
    client = Redis.from_url(server.url, decode_responses=True)
    ledger = Ledger(client)
    mirrors: list[Mirror] = []
    try:
        api = ApiWithPods([gpu_node("a")], [])
        nodes, pods, rec = await role(ledger, api)
        await rec.rebuild("start")
        await client.save()
        await restart_from_snapshot(server, client)
        for _ in range(2):
            m = Mirror(Ledger(Redis.from_url(server.url, decode_responses=True)),
                       subscriber=Redis.from_url(server.url, decode_responses=True))
            await m.start()
            await asyncio.wait_for(m.ready.wait(), 10)
            mirrors.append(m)
        extender_mirror, watcher_mirror = mirrors
        asked: list[str] = []
        heard = asyncio.Event()
        watcher_mirror.on_notice["verify"].append(lambda node: (asked.append(node), heard.set()))
        ext = Extender(CFG, extender_mirror.ledger, extender_mirror, FakeKube())  # type: ignore[arg-type]
        q: dict[str, Any] = pod("q", {"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 16,
                                     "mthreads.com/sgpu-core": 4})
        assert ext.filter({"Pod": q, "NodeNames": ["a"]})["NodeNames"] == ["a"]  # the mirror cannot tell
        out = await ext.bind({"PodName": "p-q", "PodNamespace": "ns", "PodUID": "q", "Node": "a"})
        assert UNVERIFIED in out["Error"], out
        await asyncio.wait_for(heard.wait(), 5)
        assert asked == ["a"]
        nodes.reflector.synced.set()
        pods.reflector.synced.set()
        rec.touch("a")  # what the role wires the notice to
        rec.keep_ms = 0  # no bind was in flight: no wait (the role waits its keep window)
        # the first comparison starts the window; only a read begun after that may verify the node
        assert (await rec.reconcile_nodes({"a"})) == {"unverified": 1}
        assert (await rec.reconcile_nodes({"a"})) == {"unverified": 1}
        assert ext.filter({"Pod": q, "NodeNames": ["a"]})["NodeNames"] == ["a"]  # kube-scheduler's retry
        assert (await ext.bind({"PodName": "p-q", "PodNamespace": "ns", "PodUID": "q", "Node": "a"}))["Error"] == ""
        await ext.settled()
    finally:
        for m in mirrors:
            await m.stop()
            await m.ledger.redis.aclose()
            await m.subscriber.aclose()
        await client.aclose()


async def used(ledger: Ledger, node: str, card: int) -> int:
    snap = await ledger.snapshot(node)
    assert snap is not None
    return snap.cards[card].mem_used


@pytest.mark.parametrize("ahead_ms", [0, 30_000], ids=["same clocks", "the old server's clock 30 s ahead"])
async def test_a_pending_booking_brought_back_by_the_restart_is_not_answered_again(server: RedisServer,
                                                                                   ahead_ms: int) -> None:
    """Red team: p's pending booking (its binder died) was released and q booked the card after the snapshot;
    Redis comes back with p's booking. p's retried bind must not be answered `existing`: not before the
    node is compared, nor after (the comparison keeps p's pending booking, a bind may be in flight, over-full),
    whatever the clocks of the old and the new server (round 3: the booking is marked `carried`)."""
    client, ledger, api, _nodes, pods, rec = await started(server)
    try:
        assert (await ledger.reserve("a", "p", [0], 64, 12, 1, pod="ns/p"))[0].ok
        if ahead_ms:  # stamped by a server whose clock ran ahead
            await client.hset(ledger.keys.res("a", "p"), "created", await ledger.redis_time_ms() + ahead_ms)
        await client.save()
        assert await ledger.release("a", "p")  # the janitor's expiry, or a refused Binding
        assert (await ledger.reserve("a", "q", [0], 64, 12, 1, pod="ns/q"))[0].ok
        assert await ledger.mark_bound("a", "q")
        q = bound_pod("q", "a", 0, 64 * 512, 12)
        api.pods.append(q)
        await pods.on_event("ADDED", q)
        await restart_from_snapshot(server, client)
        out, _ = await ledger.reserve("a", "p", [0], 64, 12, 1, pod="ns/p")
        assert not out.ok and out.refused.startswith(UNVERIFIED), out
        rec.keep_ms = 0
        for _ in range(2):  # the window's start, then the comparison that verifies
            assert (await rec.reconcile_all()).get("unverified") == 1
        assert await used(ledger, "a", 0) == 128  # p kept (pending: its binder may be in flight), beside q
        out, _ = await ledger.reserve("a", "p", [0], 64, 12, 1, pod="ns/p")
        assert not out.ok and "over-fills" in out.refused, out
    finally:
        await client.aclose()


@pytest.mark.parametrize("watched", [True, False], ids=["the watch brought it", "the watch lags"])
async def test_a_bind_in_flight_at_the_restart_is_in_the_truth_before_the_node_is_verified(
        server: RedisServer, watched: bool) -> None:
    """Red team: p's booking was acknowledged, then lost with the restart before p's Binding was written.
    The first comparison lacks p; the node is verified only by a read of its pods begun a keep window later,
    when p's Binding (committed within its deadline, whatever the ledger says) is in the API: q never gets
    p's card. Also when the watchers' pod watch lags and has not brought p yet: before, the view was the truth
    a node was verified with (q got p's card); now only a consistent read of the API server verifies it."""
    client, ledger, api, _nodes, pods, rec = await started(server)
    try:
        await client.save()
        assert (await ledger.reserve("a", "p", [0], 64, 12, 1, pod="ns/p"))[0].ok  # acknowledged, then lost
        await restart_from_snapshot(server, client)
        rec.keep_ms = 300
        assert (await rec.reconcile_nodes({"a"})) == {"unverified": 1}  # the verify notice's touch
        refused, _ = await ledger.reserve("a", "q", [0], 64, 12, 1, pod="ns/q")
        assert refused.refused.startswith(UNVERIFIED), refused  # still within the window
        p = bound_pod("p", "a", 0, 64 * 512, 12)  # p's Binding lands, with its record
        api.pods.append(p)
        if watched:
            await pods.on_event("ADDED", p)
        await asyncio.sleep(0.4)  # the keep window passes (the role's touch comes after it)
        assert (await rec.reconcile_nodes({"a"})) == (
            {"unverified": 1} if watched else {"unverified": 1, "missing_holder": 1})
        snap = await ledger.snapshot("a")
        assert snap is not None and snap.verified and snap.reservations["p"].state == "bound"
        refused, _ = await ledger.reserve("a", "q", [0], 64, 12, 1, pod="ns/q")
        assert not refused.ok and not refused.refused.startswith(UNVERIFIED), refused  # p holds it
        assert await used(ledger, "a", 0) == 64
    finally:
        await client.aclose()


async def test_a_node_unchanged_by_the_restart_is_verified_with_the_watchers_mirror_running(
        server: RedisServer) -> None:
    """Red team: the watcher's mirror re-reads everything after the reconnect; a node whose content is the
    same must not keep its old `verified` snapshot (the reconciler reuses the mirror's decoding)."""
    client = Redis.from_url(server.url, decode_responses=True)
    sub = Redis.from_url(server.url, decode_responses=True)
    ledger = Ledger(client)
    mirror = Mirror(ledger, subscriber=sub)
    api = ApiWithPods([gpu_node("a")], [])
    nodes = NodeWatcher(api, ledger, CFG)  # type: ignore[arg-type]
    pods = PodWatcher(api, ledger, mirror, CFG, nodes.lost)  # type: ignore[arg-type]
    wire(nodes, pods)
    pods.nudger.nudge = lambda node: None  # type: ignore[method-assign]
    rec = Reconciler(api, ledger, CFG, nodes, pods, keep_ms=0)  # type: ignore[arg-type]
    nodes.reflector.synced.set()
    pods.reflector.synced.set()
    reconnected = asyncio.Event()
    mirror.on_reconnect.append(reconnected.set)
    try:
        await rec.rebuild("start")
        await mirror.start()
        await asyncio.wait_for(mirror.ready.wait(), 10)
        assert not await rec.reconcile_all()  # the reconciler learns the mirror's decoding of node a
        await client.save()
        await restart_from_snapshot(server, client)
        await asyncio.wait_for(reconnected.wait(), 20)  # the mirror re-read everything
        assert mirror.get("a") is not None and not mirror.get("a").verified  # type: ignore[union-attr]
        for _ in range(2):  # the window's start, then the comparison that verifies
            assert (await rec.reconcile_all()) == {"unverified": 1}
        assert (await ledger.reserve("a", "q", [0], 8, 2, 1, pod="ns/q"))[0].ok
    finally:
        await mirror.stop()
        await client.aclose()
        await sub.aclose()


@pytest.mark.parametrize("path", ["reconciler pass (node_missing)", "rebuild (node watcher: node missing)"])
async def test_a_node_the_restart_lost_waits_the_window_too(server: RedisServer, path: str) -> None:
    """Red team: node b joined after the last SAVE and p's booking on b was acknowledged (its Binding in flight);
    Redis comes back without b. Written again by the pass or the rebuild, b is not new: the watchers knew it."""
    client, ledger, api, nodes, _pods, rec = await started(server)
    try:
        await client.save()  # snapshot: only node a
        api.nodes.append(gpu_node("b"))
        await nodes.on_event("ADDED", gpu_node("b"))  # node b joins (after the snapshot)
        assert (await ledger.snapshot("b")).verified  # type: ignore[union-attr]
        assert (await ledger.reserve("b", "p", [0], 64, 12, 1, pod="ns/p"))[0].ok  # acked, Binding in flight
        await restart_from_snapshot(server, client)
        assert await ledger.snapshot("b") is None and await ledger.intact()
        rec.keep_ms = 10_000  # the role's window
        if path.startswith("reconciler"):
            await rec.reconcile_all()  # mirror.on_reconnect -> wake -> pass
        else:
            await nodes.on_event("MODIFIED", gpu_node("b", units=80))  # a change: upsert create=False -> lost
            assert nodes.lost.is_set()
            await rec.rebuild("node missing")
        snap_a, snap_b = await ledger.snapshot("a"), await ledger.snapshot("b")
        assert snap_a is not None and not snap_a.verified  # the old node waits its window
        assert snap_b is not None and not snap_b.verified
        out, _ = await ledger.reserve("b", "q", [0], 64, 12, 1, pod="ns/q")
        assert not out.ok and out.refused.startswith(UNVERIFIED), out
    finally:
        await client.aclose()


async def test_a_fail_back_to_a_server_that_never_restarted_is_a_new_history() -> None:
    """Red team, Sentinel-style: A master (run a), B its replica. A is cut off; B promoted; A still acknowledges p's
    booking (or it was just not replicated). A rejoins as B's replica (full resync: p's booking gone); the
    watchers do not get to verify node a on B (B's tenure shorter than the keep window, or the watcher down).
    Failback to A: A's run_id is unchanged, node a still carries run=a -> verified, p's card is free."""
    A = RedisServer().start()
    B = RedisServer().start()
    ca, la, _api, _nodes, _pods, rec = await started(A)
    cb = Redis.from_url(B.url, decode_responses=True)
    try:
        run_a = (await ca.info("server"))["run_id"]
        await cb.execute_command("REPLICAOF", "127.0.0.1", A.port)
        for _ in range(100):
            if (await cb.info("replication")).get("master_link_status") == "up":
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.3)
        # A's first replica made A start a replication history of its own (a new master_replid): its nodes are
        # verified again once (no window: nothing was in flight)
        rec.keep_ms = 0
        for _ in range(2):  # the window's start, then the comparison that verifies
            assert await rec.reconcile_all() == {"unverified": 1}
        assert (await la.snapshot("a")).verified  # type: ignore[union-attr]
        await cb.execute_command("REPLICAOF", "NO", "ONE")  # failover: B promoted
        assert (await la.reserve("a", "p", [0], 64, 12, 1, pod="ns/p"))[0].ok  # acked by A, never on B
        lb = Ledger(cb)
        assert not (await lb.snapshot("a")).verified  # type: ignore[union-attr]  # fence holds on B
        await ca.execute_command("REPLICAOF", "127.0.0.1", B.port)  # A demoted, resyncs from B
        for _ in range(100):
            if (await ca.info("replication")).get("master_link_status") == "up":
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.3)
        await ca.execute_command("REPLICAOF", "NO", "ONE")  # failback: A promoted again
        await cb.execute_command("REPLICAOF", "127.0.0.1", A.port)
        assert (await ca.info("server"))["run_id"] == run_a
        snap = await la.snapshot("a")
        assert snap is not None and "p" not in snap.reservations  # lost with the resync
        out, _ = await la.reserve("a", "q", [0], 64, 12, 1, pod="ns/q")
        assert not out.ok and out.refused.startswith(UNVERIFIED), out  # its replication id changed
    finally:
        await ca.aclose()
        await cb.aclose()
        A.cleanup()
        B.cleanup()


async def test_a_node_that_offers_no_card_for_a_moment_is_not_made_new(server: RedisServer) -> None:
    """Red team: after the restart node a is unverified (p's acked booking lost, Binding in flight). Its
    capacity reads 0 for a moment (device plugin re-registering): removing it (nothing settles: the booking is
    lost) and adding it again would make it new to Redis (verified at once): it is kept, unverified."""
    client, ledger, _api, nodes, _pods, _rec = await started(server)
    try:
        await client.save()
        assert (await ledger.reserve("a", "p", [0], 64, 12, 1, pod="ns/p"))[0].ok
        await restart_from_snapshot(server, client)
        assert not (await ledger.snapshot("a")).verified  # type: ignore[union-attr]
        zero = {"metadata": {"name": "a"}, "status": {"capacity": {}, "allocatable": {}}}
        await nodes.on_event("MODIFIED", zero)
        await nodes.on_event("MODIFIED", gpu_node("a"))
        snap = await ledger.snapshot("a")
        assert snap is not None
        out, _ = await ledger.reserve("a", "q", [0], 64, 12, 1, pod="ns/q")
        assert not snap.verified and not out.ok and out.refused.startswith(UNVERIFIED), out
    finally:
        await client.aclose()


async def test_a_pending_booking_over_a_lowered_max_inst_is_answered_again(server: RedisServer) -> None:
    """Red team: without any fault, a card over-filled since a booking was made (a lowered max_inst) does not make
    its retried bind refused: the refusal is for bookings older than the node's last verification."""
    client = Redis.from_url(server.url, decode_responses=True)
    ledger = Ledger(client)
    inv = Inventory("n", (Card("n", 0, 96, max_slices=2), Card("n", 1, 96)))
    await ledger.list_node("n")
    assert await ledger.upsert_node(inv) > 0
    assert (await ledger.snapshot("n")).verified  # type: ignore[union-attr]
    assert (await ledger.reserve("n", "q", [0], 8, 2, 1, pod="ns/q"))[0].ok
    assert await ledger.mark_bound("n", "q")
    # p's bind: booked, Binding answer lost (unknown outcome: booking kept pending), kube-scheduler retries
    assert (await ledger.reserve("n", "p", [0], 8, 2, 1, pod="ns/p"))[0].ok
    # meanwhile the node agent lowers max_inst on card 0 to 1 (NodeWatcher -> upsert_node)
    assert await ledger.upsert_node(Inventory("n", (Card("n", 0, 96, max_slices=1), Card("n", 1, 96))),
                                    create=False) > 0
    out, _ = await ledger.reserve("n", "p", [0], 8, 2, 1, pod="ns/p")
    assert out.ok and out.existing, out
    await client.aclose()


@pytest.mark.parametrize("view_down", [False, True], ids=["pod view live", "pod view down"])
@pytest.mark.parametrize("held", [False, True], ids=["nothing held", "another pod held there"])
async def test_a_node_the_restart_lost_that_offers_no_card_for_a_moment_is_a_loss(server: RedisServer,
                                                                                  held: bool, view_down: bool) -> None:
    """Red team (round 3): b joined after the snapshot and p's bind on b is in flight; Redis comes back without b.
    Before any pass, b's capacity reads 0 for a moment: the node watcher must take b's absence as a loss (a
    rebuild, whose nodes wait the keep window), not forget it and write it back as new. The same while the pod
    stream is down (a later red team: `lost` was honoured only by a writer whose view was live)."""
    client, ledger, api, nodes, pods, rec = await started(server)
    try:
        await client.save()
        api.nodes.append(gpu_node("b"))
        await nodes.on_event("ADDED", gpu_node("b"))
        if held:
            assert (await ledger.reserve("b", "r", [1], 8, 2, 1, pod="ns/r"))[0].ok
            r = bound_pod("r", "b", 1, 8 * 512, 2)
            api.pods.append(r)
            await pods.on_event("ADDED", r)
        assert (await ledger.reserve("b", "p", [0], 64, 12, 1, pod="ns/p"))[0].ok  # its Binding in flight
        await restart_from_snapshot(server, client)
        if view_down:
            nodes.view_problem = lambda: "pods: watch stream down for 3s"
        await nodes.on_event("MODIFIED", {"metadata": {"name": "b"}, "status": {"capacity": {}, "allocatable": {}}})
        await nodes.on_event("MODIFIED", gpu_node("b"))
        if nodes.lost.is_set():  # the role's reconciler rebuilds
            await rec.rebuild("node missing")
        out, _ = await ledger.reserve("b", "q", [0], 64, 12, 1, pod="ns/q")
        assert not out.ok and out.refused.startswith(UNVERIFIED), out
    finally:
        await client.aclose()


async def test_a_second_watchers_start_up_rebuild_does_not_verify_a_node_the_restart_lost(
        server: RedisServer) -> None:
    """Red team (round 3): b joined after the snapshot, p's bind on b in flight; Redis comes back without b and a
    second watcher replica starts (a rolling update) before the first notices: its start-up rebuild writes b
    new to Redis, and must not verify it at once while pods of ours exist (a bind may be in flight)."""
    client, ledger, api, nodes, _pods, _rec = await started(server)
    other = Redis.from_url(server.url, decode_responses=True)
    try:
        await client.save()
        api.nodes.append(gpu_node("b"))
        await nodes.on_event("ADDED", gpu_node("b"))
        api.pods.append(pod("p", {"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 64,
                                  "mthreads.com/sgpu-core": 12}))  # pending: its bind in flight
        assert (await ledger.reserve("b", "p", [0], 64, 12, 1, pod="ns/p"))[0].ok
        await restart_from_snapshot(server, client)
        nodes_b, pods_b, rec_b = await role(Ledger(other), api)
        nodes_b.reflector.synced.set()
        pods_b.reflector.synced.set()
        await rec_b.rebuild("start")
        snap = await ledger.snapshot("b")
        assert snap is not None and not snap.verified
        out, _ = await ledger.reserve("b", "q", [0], 64, 12, 1, pod="ns/q")
        assert not out.ok and out.refused.startswith(UNVERIFIED), out
    finally:
        await other.aclose()


async def test_an_unverified_node_gone_from_the_api_is_removed_after_the_window(server: RedisServer) -> None:
    """Red team (round 3): a node of the restored history that the API no longer has is kept while unverified
    (removed, it would come back new), but verified after the keep window and then removed."""
    client, ledger, api, nodes, _pods, rec = await started(server)
    try:
        api.nodes.append(gpu_node("b"))
        await nodes.on_event("ADDED", gpu_node("b"))
        await client.save()
        await restart_from_snapshot(server, client)
        api.nodes[:] = [n for n in api.nodes if n["metadata"]["name"] != "b"]
        await nodes.on_event("DELETED", gpu_node("b"))
        rec.keep_ms = 200
        await rec.reconcile_all()
        assert "b" in await ledger.nodes()  # unverified: kept for now
        await asyncio.wait_for(rec._touch.wait(), 5)  # the second comparison, a keep window later
        await rec.reconcile_nodes(set(rec.touched))
        await rec.reconcile_all()
        assert "b" not in await ledger.nodes() and await ledger.snapshot("b") is None
    finally:
        await client.aclose()


async def test_only_a_consistent_read_begun_after_the_window_verifies_a_node(server: RedisServer) -> None:
    """replace_node's side of it: a truth without `truth_at` (a watch's view) never verifies a node of another
    history, a read begun before the window ended does not either, one begun after does, and a `truth_at`
    later than the script's own clock is refused."""
    client, ledger, _api, nodes, _pods, _rec = await started(server)
    try:
        await client.save()
        await restart_from_snapshot(server, client)
        inv = nodes.last["a"]
        first = await ledger.replace_node(inv, {}, verify_after_ms=200)
        assert not first["verified"] and 0 < first["verify_in_ms"] <= 200 and first["was_unverified"]
        # a read begun 1 ms before the window ended, from the window's start as the script wrote it (no clock race)
        since = await client.hget(ledger.node_key("a"), "unverified_since")
        early = int(str(since).rsplit(":", 1)[1]) + 199
        await asyncio.sleep(0.25)
        view = await ledger.replace_node(inv, {}, verify_after_ms=200)  # the window is over, but no read
        assert not view["verified"] and view["verify_in_ms"] == 0
        assert not (await ledger.replace_node(inv, {}, verify_after_ms=200, truth_at=early))["verified"]
        with pytest.raises(LedgerError, match="truth_at"):
            await ledger.replace_node(inv, {}, verify_after_ms=200, truth_at=early + 60_000)
        assert not (await ledger.snapshot("a")).verified  # type: ignore[union-attr]
        began = (await ledger.clocks(["a"]))["a"]
        verifying = await ledger.replace_node(inv, {}, verify_after_ms=200, truth_at=began)
        assert verifying["verified"] and verifying["was_unverified"]  # this write verified it ...
        assert (await ledger.snapshot("a")).verified  # type: ignore[union-attr]
        again = await ledger.replace_node(inv, {}, verify_after_ms=200, truth_at=began)
        assert again["verified"] and not again["was_unverified"]  # ... and no later one says so again
    finally:
        await client.aclose()


async def test_a_writer_that_knows_a_node_was_lost_never_verifies_it_at_once(server: RedisServer) -> None:
    """Red team: `lost` was honoured only with verify_after_ms, which a writer whose pod view is not live
    does not pass: a node Redis lost was then written back verified."""
    client, ledger, *_ = await started(server)
    try:
        await ledger.list_node("z")
        out = await ledger.replace_node(Inventory("z", (Card("z", 0, 96),)), {}, lost=True)
        assert not out["verified"], out
        assert not (await ledger.snapshot("z")).verified  # type: ignore[union-attr]
    finally:
        await client.aclose()


async def test_a_rebuild_counts_the_nodes_it_verified(server: RedisServer) -> None:
    """Ledger.rebuild's "verified": the nodes its writes verified (the reconciler adds them to
    mtsched_nodes_verified_total), none when they were verified already; "unverified" the ones still waiting."""
    client, ledger, _api, nodes, _pods, _rec = await started(server)
    try:
        await client.save()
        await restart_from_snapshot(server, client)
        inv = nodes.last["a"]
        waiting = await ledger.rebuild([inv], {}, keep_ms=0, verify_after_ms=0)  # a view: no read, no verdict
        assert (waiting["verified"], waiting["unverified"]) == (0, 1), waiting
        began = (await ledger.clocks(["a"]))["a"]
        done = await ledger.rebuild([inv], {}, keep_ms=0, verify_after_ms=0, truth_at={"a": began})
        assert (done["verified"], done["unverified"]) == (1, 0), done
        again = await ledger.rebuild([inv], {}, keep_ms=0, verify_after_ms=0, truth_at={"a": began})
        assert (again["verified"], again["unverified"]) == (0, 0), again
    finally:
        await client.aclose()
