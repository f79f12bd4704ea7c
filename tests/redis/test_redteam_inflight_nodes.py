"""Red team on commit e24f59c (bookings in flight survive a node that goes and comes back): the node paths.

Attacks: remove_node's settle check under MOREKEYS (a replica that knows nothing of the node); a kept
booking on a deleted node that must still end (janitor TTL) and the node then go (reconciler); a lagging
watcher replica replaying DELETE after the other re-created the node under a bind in flight; the node
re-created with fewer cards or another model; an over-full card as the extender's Python fit reads it;
a deleted node judged by a pod view that is not live.

Real parts: redis-server, the product's Ledger, Mirror, NodeWatcher, PodWatcher, Janitor and Reconciler.
The API client is a stand-in that no call here may reach (each test says what the API holds by the
watchers' view)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest
from redis.asyncio import Redis

from controller.janitor import Janitor
from controller.node_watch import NodeWatcher
from controller.pod_watch import PodWatcher
from controller.reconciler import Reconciler
from controller.watchers import wire
from shared.config import load_config
from shared.domain.annotations import CardGrant, PodUsage, binding_annotations, device_id
from shared.domain.fit import fit
from shared.domain.request import pod_request
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis.helpers import violations
from tests.redis.test_script_keys import cold

pytestmark = pytest.mark.redis
CFG = load_config(env={}, flags={"memoryPerCard": "96,160"})
KEEP_MS = 10_000


class NoKube:
    """The watchers' API client: none of these tests expects a call."""

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        raise AssertionError(f"unexpected {method} {path}")

    async def get_pod(self, ns: str, name: str) -> Any:
        raise AssertionError(f"unexpected GET pod {ns}/{name}")


def gpu_node(name: str, units: int = 96, cards: int = 2) -> dict[str, Any]:
    cap = {"mthreads.com/sgpu-core": str(16 * cards), "mthreads.com/sgpu-memory": str(units * cards)}
    return {"metadata": {"name": name}, "status": {"capacity": cap, "allocatable": cap}}


def watcher(ledger: Ledger, holders: Mapping[str, tuple[PodUsage, str]] | None = None,
            kube: NoKube | None = None) -> NodeWatcher:
    w = NodeWatcher(kube or NoKube(), ledger, CFG, keep_ms=KEEP_MS)  # type: ignore[arg-type]
    w.holders = lambda node: dict(holders or {})
    return w


async def used(ledger: Ledger, node: str) -> dict[int, tuple[int, int, int, str]]:
    s = (await ledger.snapshots([node])).get(node)
    return {} if s is None else {i: (c.mem_used, c.cores_used, c.slices, c.health) for i, c in s.cards.items()}


async def age(redis: Redis, ledger: Ledger, node: str, uid: str, ms: int) -> None:
    """Make reservation `uid` `ms` older (its stamps), as if that much time had passed."""
    key = ledger.keys.res(node, uid)
    created, bound_at = await redis.hmget(key, ["created", "bound_at"])  # type: ignore[misc]
    await redis.hset(key, "created", int(created) - ms)  # type: ignore[misc]
    if bound_at is not None:
        await redis.hset(key, "bound_at", int(bound_at) - ms)  # type: ignore[misc]


async def test_remove_node_keeps_its_settle_check_when_the_caller_knows_no_key(ledger: Ledger,
                                                                               redis_client: Redis) -> None:
    """A replica that never read the node declares only the node hash: the script answers MOREKEYS, and
    the call made again with every key must still carry keep_ms (else it forgets the bind in flight)."""
    w = watcher(ledger)
    await w.on_event("ADDED", gpu_node("mk"))
    for i in range(5):
        assert (await ledger.reserve("mk", f"u{i}", [i % 2], 2, 1, 1, pod=f"ns/u{i}"))[0].ok
        if i != 3:
            assert await ledger.mark_bound("mk", f"u{i}")
            await age(redis_client, ledger, "mk", f"u{i}", 60_000)
    fresh = Ledger(redis_client)  # no key of "mk" known
    assert fresh.known("mk").uids == frozenset()
    assert await fresh.remove_node("mk", KEEP_MS) is None
    assert "u3" in (await ledger.snapshots(["mk"]))["mk"].reservations
    assert "mk" in await ledger.nodes()
    # the same replica, the pending one gone: now nothing settles and the node goes whole
    assert await ledger.release("mk", "u3")
    assert await Ledger(redis_client).remove_node("mk", KEEP_MS) is True
    assert "mk" not in await ledger.nodes() and await ledger.snapshot("mk") is None


async def test_a_booking_kept_on_a_deleted_node_ends_and_the_node_then_goes(ledger: Ledger,
                                                                            redis_client: Redis) -> None:
    """No state left for ever: the bind in flight never completes (its binder died), the janitor expires
    it after the TTL on the placeholder cards, and the next reconcile pass forgets the node."""
    nodes = watcher(ledger)
    await nodes.on_event("ADDED", gpu_node("jn"))
    assert (await ledger.reserve("jn", "p1", [0], 64, 12, 1, pod="ns/p1"))[0].ok
    await nodes.on_event("DELETED", gpu_node("jn"))
    snap = (await ledger.snapshots(["jn"]))["jn"]
    assert "p1" in snap.reservations and snap.card_states() == []
    mirror = Mirror(ledger)
    pods = PodWatcher(NoKube(), ledger, mirror, CFG, nodes.lost)  # type: ignore[arg-type]
    nodes.holders = pods.holders
    reconciler = Reconciler(NoKube(), ledger, CFG, nodes, pods)  # type: ignore[arg-type]
    # while it settles, a pass leaves it as it is (and keeps trying)
    assert await reconciler.reconcile_all() == {}
    assert "jn" in await ledger.nodes() and "p1" in (await ledger.snapshots(["jn"]))["jn"].reservations
    await age(redis_client, ledger, "jn", "p1", CFG.pending_ttl_seconds * 1000 + 1000)
    await mirror.start()
    try:
        await asyncio.wait_for(mirror.ready.wait(), 5)
        assert "jn" in mirror.nodes  # the janitor walks the mirror: the placeholder node must be in it
        assert await Janitor(ledger, mirror, CFG).sweep() == ["p1"]
    finally:
        await mirror.stop()
    await reconciler.reconcile_all()
    assert "jn" not in await ledger.nodes() and await ledger.snapshot("jn") is None
    assert "jn" not in nodes.known
    # and comes back empty
    await nodes.on_event("ADDED", gpu_node("jn"))
    assert await used(ledger, "jn") == {0: (0, 0, 0, "ok"), 1: (0, 0, 0, "ok")}


async def test_a_bound_booking_kept_on_a_deleted_node_goes_with_its_keep_window(ledger: Ledger,
                                                                                redis_client: Redis) -> None:
    """Bound a moment ago (kept as settling), and no pod ever shows up in the view: once its keep window
    is over the reconciler judges it (asks the API server: here the pod is gone) and forgets the node.
    The bound_at that replace_node restored is what ends the window, not the time of the replace."""
    nodes = watcher(ledger)
    await nodes.on_event("ADDED", gpu_node("kb"))
    assert (await ledger.reserve("kb", "b1", [1], 8, 2, 1, pod=""))[0].ok  # no pod name: stale once judged
    assert await ledger.mark_bound("kb", "b1")
    bound_at = (await ledger.snapshots(["kb"]))["kb"].reservations["b1"].bound_at
    await nodes.on_event("DELETED", gpu_node("kb"))
    kept = (await ledger.snapshots(["kb"]))["kb"].reservations["b1"]
    assert kept.state == "bound" and kept.bound_at == bound_at
    pods = PodWatcher(NoKube(), ledger, Mirror(ledger), CFG, nodes.lost)  # type: ignore[arg-type]
    reconciler = Reconciler(NoKube(), ledger, CFG, nodes, pods)  # type: ignore[arg-type]
    assert await reconciler.reconcile_all() == {}
    assert "b1" in (await ledger.snapshots(["kb"]))["kb"].reservations
    await age(redis_client, ledger, "kb", "b1", KEEP_MS + 1000)
    await reconciler.reconcile_all()  # a suspect now: confirmed stale (no pod name), dropped ...
    await reconciler.reconcile_all()  # ... and the empty node forgotten
    assert "kb" not in await ledger.nodes() and await ledger.snapshot("kb") is None


@pytest.mark.parametrize("with_holder", [False, True], ids=["no holder", "a bound holder"])
async def test_a_lagging_replica_replays_delete_after_the_other_recreated_the_node(
        ledger: Ledger, redis_client: Redis, with_holder: bool) -> None:
    """Replica B sees the node deleted and re-created, and a bind lands on the re-created node; replica
    A, lagging, then replays the same DELETE and ADDED. Nothing booked is lost, nothing offered twice."""
    holder = {"h": (PodUsage("lg", (1,), 8, 2, 1), "ns/h")} if with_holder else {}
    a = watcher(Ledger(redis_client), holder)
    b = watcher(Ledger(redis_client), holder)
    for w in (a, b):
        await w.on_event("ADDED", gpu_node("lg"))
    if with_holder:
        assert (await ledger.reserve("lg", "h", [1], 8, 2, 1, pod="ns/h"))[0].ok
        assert await ledger.mark_bound("lg", "h")
        await age(redis_client, ledger, "lg", "h", 60_000)
    assert (await ledger.reserve("lg", "p1", [0], 32, 8, 1, pod="ns/p1"))[0].ok  # in flight
    await b.on_event("DELETED", gpu_node("lg"))
    await b.on_event("ADDED", gpu_node("lg"))
    assert (await ledger.reserve("lg", "p2", [0], 32, 4, 1, pod="ns/p2"))[0].ok  # in flight, on the new node
    assert await ledger.mark_bound("lg", "p1")
    await a.on_event("DELETED", gpu_node("lg"))  # late
    mid = (await ledger.snapshots(["lg"]))["lg"]
    assert sorted(mid.reservations) == sorted(["p1", "p2", *holder]) and mid.card_states() == []
    await a.on_event("ADDED", gpu_node("lg"))  # late too: back as it is
    want = {0: (64, 12, 2, "ok"), 1: ((8, 2, 1, "ok") if with_holder else (0, 0, 0, "ok"))}
    assert await used(ledger, "lg") == want
    snap = (await ledger.snapshots(["lg"]))["lg"]
    assert violations(snap) == []
    assert not (await ledger.reserve("lg", "p3", [0], 48, 2, 1))[0].ok  # 64 of 96 held: no 48 more
    assert await ledger.mark_bound("lg", "p2")


@pytest.mark.parametrize("same_replica", [True, False], ids=["the replica that saw it go", "a fresh replica"])
async def test_the_node_recreated_with_fewer_cards_keeps_the_bind_in_flight(ledger: Ledger, redis_client: Redis,
                                                                            same_replica: bool) -> None:
    w = watcher(ledger)
    await w.on_event("ADDED", gpu_node("fc", cards=2))
    assert (await ledger.reserve("fc", "p1", [1], 64, 12, 1, pod="ns/p1"))[0].ok
    await w.on_event("DELETED", gpu_node("fc", cards=2))
    w2 = w if same_replica else watcher(Ledger(redis_client))
    await w2.on_event("ADDED", gpu_node("fc", cards=1))  # card 1 did not come back
    assert await used(ledger, "fc") == {0: (0, 0, 0, "ok"), 1: (64, 12, 1, "removed")}
    assert not (await ledger.reserve("fc", "p2", [1], 2, 1, 1))[0].ok  # a removed card offers nothing
    assert await ledger.mark_bound("fc", "p1")
    assert await ledger.release("fc", "p1")  # the pod ends: the placeholder card goes with it
    assert await used(ledger, "fc") == {0: (0, 0, 0, "ok")}


@pytest.mark.parametrize("same_replica", [True, False], ids=["the replica that saw it go", "a fresh replica"])
async def test_the_node_recreated_as_another_model_offers_nothing_the_bind_in_flight_holds(
        ledger: Ledger, redis_client: Redis, same_replica: bool) -> None:
    """A whole S4000 card (96 units, every core) booked in flight; the node comes back as S5000 (160):
    the card keeps the booking and, every core taken, offers nothing."""
    w = watcher(ledger)
    await w.on_event("ADDED", gpu_node("mo", 96))
    assert (await ledger.reserve("mo", "p1", [0], 96, 16, 1, model=96, whole=True, pod="ns/p1"))[0].ok
    await w.on_event("DELETED", gpu_node("mo", 96))
    w2 = w if same_replica else watcher(Ledger(redis_client))
    await w2.on_event("ADDED", gpu_node("mo", 160))
    got = await used(ledger, "mo")
    assert got[0] == (96, 16, 1, "ok") and got[1] == (0, 0, 0, "ok")
    out, _ = await ledger.reserve("mo", "p2", [0], 32, 0, 1, pod="ns/p2")
    assert not out.ok and out.reason == "CardComputeUnitsExhausted"


async def test_an_overfull_card_offers_nothing_to_the_extenders_fit(ledger: Ledger) -> None:
    """replace_node keeps a bind in flight that over-fills a card next to the truth. The Lua rule refuses
    the card (test_scripts_behaviour); so must the Python fit the extender filters with, on the mirror's
    copy, whose free memory would be negative if read as capacity - used."""
    w = watcher(ledger)
    await w.on_event("ADDED", gpu_node("of", 96, 1))
    assert (await ledger.reserve("of", "p1", [0], 64, 4, 1, pod="ns/p1"))[0].ok
    truth = {"b1": (PodUsage("of", (0,), 64, 4, 1), "ns/b1")}  # a record the view just learned
    w2 = watcher(ledger, truth)
    await w2.on_event("DELETED", gpu_node("of", 96, 1))
    await w2.on_event("ADDED", gpu_node("of", 96, 1))  # new to w2: written whole with its holder
    snap = (await ledger.snapshots(["of"]))["of"]
    assert sorted(snap.reservations) == ["b1", "p1"] and snap.cards[0].mem_used == 128
    small = pod_request({"metadata": {"name": "x", "namespace": "ns"}, "spec": {"containers": [
        {"name": "c", "resources": {"limits": {"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "2",
                                               "mthreads.com/sgpu-core": "1"}}}]}}, CFG)
    assert small is not None
    result = fit(snap.card_states(), small, {})
    assert not result.ok and result.cards == ()


def bound_pod(uid: str, node: str, card: int, mib: int, cores: int) -> dict[str, Any]:
    ann = binding_annotations(node, [[CardGrant(device_id(node, card), mib, cores)]], 0)
    return {"metadata": {"name": uid, "namespace": "ns", "uid": uid, "annotations": ann},
            "spec": {"nodeName": node, "schedulerName": "hami-scheduler", "containers": [
                {"name": "c", "resources": {"limits": {"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "64",
                                                       "mthreads.com/sgpu-core": "12"}}}]}}


async def live_on(ledger: Ledger, node: str, units: int = 96) -> tuple[NodeWatcher, PodWatcher]:
    """The node watcher and a live pod watcher, wired as the role wires them, the GPU node `node` added."""
    nodes = watcher(ledger)
    pods = pods_of(ledger, nodes, live=True)
    await nodes.on_event("ADDED", gpu_node(node, units=units))
    return nodes, pods


def pods_of(ledger: Ledger, nodes: NodeWatcher, live: bool) -> PodWatcher:
    pods = PodWatcher(NoKube(), ledger, Mirror(ledger), CFG, nodes.lost)  # type: ignore[arg-type]
    wire(nodes, pods)  # as run_watcher connects them
    nodes.reflector.synced.set()
    pods.reflector.synced.set()
    if not live:
        pods.reflector._failing(ConnectionError("the API server went away"))  # the pod stream is down
    return pods


@pytest.mark.parametrize("same_replica", [True, False], ids=["the replica that saw it go", "a fresh replica"])
async def test_a_deleted_node_is_not_judged_by_a_pod_view_that_is_not_live(ledger: Ledger, redis_client: Redis,
                                                                           same_replica: bool) -> None:
    """The pod stream is down (an API server restart; its re-list of thousands of pods takes a while)
    while the node stream delivers the DELETE. A pod bound 15 s ago is in no view: not a holder, and
    past the 10 s keep window. The reconciler would not judge anything with this view (views_live); the
    node watcher must not either: forgetting the booking offers its share again once the node is back,
    and the pod's record, arriving with the pod stream, then over-commits the card."""
    nodes = watcher(ledger)
    pods = pods_of(ledger, nodes, live=False)
    await nodes.on_event("ADDED", gpu_node("sv"))
    assert (await ledger.reserve("sv", "b1", [0], 64, 12, 1, pod="ns/b1"))[0].ok
    assert await ledger.mark_bound("sv", "b1")
    await age(redis_client, ledger, "sv", "b1", 15_000)
    reconciler = Reconciler(NoKube(), ledger, CFG, nodes, pods)  # type: ignore[arg-type]
    assert reconciler.views_live().startswith("pods: stream failing")  # the reconciler would wait
    await nodes.on_event("DELETED", gpu_node("sv"))
    assert "b1" in (await ledger.snapshots(["sv"]))["sv"].reservations
    if not same_replica:  # the node is new to the replica that sees it come back
        nodes = watcher(ledger)
        pods = pods_of(ledger, nodes, live=False)
    await nodes.on_event("ADDED", gpu_node("sv"))
    assert (await used(ledger, "sv"))[0] == (64, 12, 1, "ok"), "the bound pod's share was forgotten"
    assert not (await ledger.reserve("sv", "p2", [0], 64, 12, 1, pod="ns/p2"))[0].ok
    # the stream is back with the pod in its view: the reconciler finds the booking explained
    pods.reflector._working()
    pods.learn("b1", bound_pod("b1", "sv", 0, 64 * 1024, 12))
    reconciler = Reconciler(NoKube(), ledger, CFG, nodes, pods)  # type: ignore[arg-type]
    assert not reconciler.views_live()
    assert await reconciler.reconcile_all() == {}
    assert (await used(ledger, "sv"))[0] == (64, 12, 1, "ok")


async def test_a_live_pod_view_still_forgets_what_nobody_holds(ledger: Ledger, redis_client: Redis) -> None:
    """The other side of the attack above: with the pod view live, a deleted node where a bound booking
    older than the keep window has no holder is forgotten at once (nothing kept for ever)."""
    nodes = watcher(ledger)
    pods_of(ledger, nodes, live=True)
    await nodes.on_event("ADDED", gpu_node("sl"))
    assert (await ledger.reserve("sl", "b1", [0], 64, 12, 1, pod="ns/b1"))[0].ok
    assert await ledger.mark_bound("sl", "b1")
    await age(redis_client, ledger, "sl", "b1", 15_000)
    await nodes.on_event("DELETED", gpu_node("sl"))
    assert "sl" not in await ledger.nodes() and await ledger.snapshot("sl") is None


async def test_a_node_another_replica_forgot_is_rebuilt_not_written_from_one_view(
        ledger: Ledger, redis_client: Redis) -> None:
    """Both replicas keep a deleted node on placeholder cards (a bind in flight there), so both list it
    as known. The bind fails, and replica B's reconciler forgets the node. When the node is re-created,
    replica A still counts it as known and finds it missing: A writes nothing itself and asks for a
    rebuild from fresh lists (it cannot tell this from lost state; costly, never wrong), and B, to whom
    the node is new, writes it whole with its holders."""
    holder = {"h": (PodUsage("ka", (1,), 8, 2, 1), "ns/h")}
    led_a, led_b = Ledger(redis_client), Ledger(redis_client)
    api = NoKube()  # the watcher asks the API server nothing: the rebuild lists afresh
    a, b = watcher(led_a, kube=api), watcher(led_b, kube=api)
    for w in (a, b):
        pods_of(w.ledger, w, live=True)
    await led_a.rebuild([], {}, keep_ms=KEEP_MS)  # the epoch a start writes
    for w in (a, b):
        await w.on_event("ADDED", gpu_node("ka"))
    assert (await ledger.reserve("ka", "p1", [0], 32, 8, 1, pod="ns/p1"))[0].ok  # in flight
    for w in (a, b):
        await w.on_event("DELETED", gpu_node("ka"))
        assert "ka" in w.known
    assert await ledger.release("ka", "p1")  # the bind failed
    assert await ledger.remove_node("ka", KEEP_MS) is True  # B's reconciler: nothing held, forgotten
    b.known.discard("ka")
    # re-created, under a pod bound there meanwhile (in both views)
    for w in (a, b):
        w.holders = lambda node: dict(holder)
    await a.on_event("ADDED", gpu_node("ka"))
    assert a.lost.is_set() and await ledger.snapshot("ka") is None
    await b.on_event("ADDED", gpu_node("ka"))
    assert await used(ledger, "ka") == {0: (0, 0, 0, "ok"), 1: (8, 2, 1, "ok")}


async def test_a_known_node_missing_with_the_epoch_gone_is_still_lost_state(ledger: Ledger,
                                                                             redis_client: Redis) -> None:
    """The other side: Redis lost its data (no epoch): a known node missing means a rebuild."""
    a = watcher(ledger)
    pods_of(ledger, a, live=True)
    await a.on_event("ADDED", gpu_node("kl"))
    await redis_client.flushall()
    await a.on_event("MODIFIED", gpu_node("kl", cards=1))
    assert a.lost.is_set() and await ledger.snapshot("kl") is None


async def test_remove_node_with_keep_ms_declares_every_key_and_spares_what_settles(populated: Ledger) -> None:
    """On the populated fixture (also run on Sentinel and Cluster by tests/redis_ha): a replica that has
    seen nothing, whose scripts fail on any key not in KEYS, removes with keep_ms. n4 (u2 pending), n5
    (u3 pending) and nx (ux pending) stay whole; nerr (nothing booked) goes; a node never written is no
    error."""
    led = populated
    before = {n: (await led.snapshots([n]))[n] for n in ("n4", "n5", "nx")}
    for n in ("n4", "n5", "nx"):
        assert await cold(led).remove_node(n, KEEP_MS) is None
        assert (await led.snapshots([n]))[n].reservations == before[n].reservations
        assert n in await led.nodes()
    assert await cold(led).remove_node("nerr", KEEP_MS) is True
    assert "nerr" not in await led.nodes() and await led.snapshot("nerr") is None
    assert await cold(led).remove_node("ghost", KEEP_MS) is False


async def test_a_stale_event_of_a_node_another_replica_forgot_recreates_nothing(ledger: Ledger,
                                                                                 redis_client: Redis) -> None:
    """Replica A lags, and the event it handles (a MODIFIED) is older than the DELETE replica B already
    acted on: A writes nothing (no deleted node offered, not even for a moment); the rebuild it asks for
    lists the nodes afresh."""
    api = NoKube()
    a, b = watcher(Ledger(redis_client), kube=api), watcher(Ledger(redis_client), kube=api)
    for w in (a, b):
        pods_of(w.ledger, w, live=True)
    await ledger.rebuild([], {}, keep_ms=KEEP_MS)
    for w in (a, b):
        await w.on_event("ADDED", gpu_node("ks"))
    await b.on_event("DELETED", gpu_node("ks"))
    assert await ledger.snapshot("ks") is None
    await a.on_event("MODIFIED", gpu_node("ks", cards=1))  # late
    assert a.lost.is_set() and await ledger.snapshot("ks") is None and "ks" not in await ledger.nodes()
    await a.on_event("DELETED", gpu_node("ks"))  # and its DELETE, next in its stream
    assert await ledger.snapshot("ks") is None and "ks" not in a.known
