"""The janitor's reads of pods (PodWatcher.api_holds) overlap across nodes, at most API_HOLDS_READS at once.

Before it expires a pending booking past pendingTTLSeconds, the janitor reads its pod from the API server. Nodes were
swept one by one, each node's reads awaited before the next node was looked at: with an API server that answers each
GET in d seconds (under the 5 s timeout), a sweep over N nodes with a due booking each took N x d, so the last node's
stale booking held its card N x d past the documented bound (pendingTTLSeconds + one 5 s sweep), and the sweep's
progress signal (Supervisor.progress) came as late. Now every node's pods are read together, API_HOLDS_READS (8) at
a time over the whole sweep (shared/domain/timing.py says why eight), and each node's expiry is still one expire.lua
on that node, sent as soon as its own pods are answered.

No wall-clock assertion: the test's API server answers no read until API_HOLDS_READS of them are in flight at once
(an asyncio.Event), which reads made one node after another never reach: each of them then times out
(API_HOLDS_READ_S), is counted unanswered and keeps every booking. It counts the reads in flight at any moment too,
which must never pass the limit.

Real parts: redis-server, Ledger, Mirror, PodWatcher, the role's janitor (`janitor_for`); the API server is the
test's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import pytest

from controller import pod_watch
from controller.janitor import Janitor
from controller.pod_watch import PodWatcher
from controller.watchers import janitor_for
from shared.domain.timing import API_HOLDS_READS
from shared.kube import KubeError
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis.helpers import S4000, eventually, inventory
from tests.redis.test_redteam_janitor_lagging_view import kept, live
from tests.redis.test_watcher_records import CFG

pytestmark = pytest.mark.redis


class GatedApi:
    """An API server that answers no GET of a pod until `gate` reads are in flight at once (then it answers each:
    404, the pod is gone), and counts the reads in flight."""

    def __init__(self, w: PodWatcher, gate: int) -> None:
        self.gate = gate
        self.in_flight = 0
        self.most = 0  # the most reads in flight at once
        self.asked: list[str] = []
        self.full = asyncio.Event()
        w.kube.get_pod = self.get_pod  # type: ignore[method-assign]

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        self.asked.append(f"{namespace}/{name}")
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            if self.in_flight >= self.gate:
                self.full.set()
            await self.full.wait()  # (one node's reads alone never fill it: each read times out, API_HOLDS_READ_S)
            raise KubeError(404, {"message": f"pods \"{name}\" not found"}, f"GET pod {namespace}/{name}")
        finally:
            self.in_flight -= 1


async def due_bookings(led: Ledger, mirror: Mirror, w: PodWatcher,
                       per_node: dict[str, int]) -> tuple[Janitor, list[str]]:
    """`per_node[node]` pending bookings on each node (one card each), their binders dead, past a TTL of 1 s; the
    watcher role's janitor with that TTL. Returns it and the uids."""
    uids = []
    for node, n in per_node.items():
        await led.upsert_node(inventory(node, S4000, n))
        for i in range(n):
            uid = f"u-{node}-{i}"
            out, _ = await led.reserve(node, uid, [i], 8, 2, 1, pod=f"ns/p-{node}-{i}")
            assert out.ok
            uids.append(uid)
    await eventually(lambda: all(len(mirror.nodes[n].reservations) == k if n in mirror.nodes else False
                                 for n, k in per_node.items()), what="the mirror shows the bookings")
    janitor = janitor_for(led, mirror, CFG, w)
    janitor.ttl = 1

    async def past_ttl() -> bool:
        now = await led.redis_time_ms()
        return all(now - r.created > 1000 for n in per_node for r in mirror.nodes[n].reservations.values())

    await eventually(past_ttl, what="the bookings past their TTL")
    return janitor, uids


def expiries(led: Ledger) -> list[tuple[str, list[str]]]:
    """The janitor's expire.lua calls from now on: (node, the uids it was given)."""
    calls: list[tuple[str, list[str]]] = []
    expire = led.expire

    async def counted(node: str, ttl_seconds: float, only: Iterable[str] | None = None) -> list[str]:
        calls.append((node, sorted(only or [])))
        return await expire(node, ttl_seconds, only=only)

    led.expire = counted  # type: ignore[method-assign]
    return calls


async def test_one_sweep_reads_the_pods_of_many_nodes_at_once_up_to_the_limit(
        watched: tuple[Ledger, Mirror, PodWatcher]) -> None:
    led, mirror, w = watched
    live(w)
    nodes = {f"c{i:02d}": 1 for i in range(API_HOLDS_READS + 4)}  # one due booking on each of 12 nodes
    janitor, uids = await due_bookings(led, mirror, w, nodes)
    api = GatedApi(w, API_HOLDS_READS)
    calls = expiries(led)
    before = kept("api_unanswered")
    gone = await janitor.sweep()
    assert api.full.is_set() and kept("api_unanswered") == before, (
        f"the reads of {len(nodes)} nodes' pods were made {api.most} at a time (node after node): the API server "
        f"answering each in d seconds, the sweep took {len(nodes)} x d; here {kept('api_unanswered') - before:g} "
        f"bookings were kept unanswered")
    assert api.most == API_HOLDS_READS, f"{api.most} reads at once, the limit is {API_HOLDS_READS}"
    assert sorted(gone) == sorted(uids) and len(api.asked) == len(nodes)
    assert sorted(n for n, _ in calls) == sorted(nodes), f"one expire.lua per node: {calls}"
    for n in nodes:
        snap = await led.snapshot(n)
        assert snap is not None and not snap.reservations


async def test_the_limit_holds_over_the_whole_sweep_not_per_node(watched: tuple[Ledger, Mirror, PodWatcher]) -> None:
    """A node with several due bookings and nodes with one: their reads share the API_HOLDS_READS turns (one node's
    reads alone never fill them), and each node's bookings go in one expire.lua call on that node."""
    led, mirror, w = watched
    live(w)
    nodes = {"big": 5, **{f"s{i}": 1 for i in range(API_HOLDS_READS)}}  # 13 reads: 5 on one node, 8 on others
    janitor, uids = await due_bookings(led, mirror, w, nodes)
    api = GatedApi(w, API_HOLDS_READS)
    calls = expiries(led)
    gone = await janitor.sweep()
    assert api.full.is_set(), (
        f"at most {api.most} reads at once: the nodes' reads did not overlap (a node's own were {nodes['big']})")
    assert api.most <= API_HOLDS_READS, f"{api.most} reads at once over the sweep, the limit is {API_HOLDS_READS}"
    assert sorted(gone) == sorted(uids)
    assert sorted(calls) == sorted((n, sorted(u for u in uids if u.startswith(f"u-{n}-"))) for n in nodes), calls


async def test_an_unanswering_api_server_keeps_the_limits_reads_waiting_and_the_rest_unread(
        watched: tuple[Ledger, Mirror, PodWatcher], monkeypatch: pytest.MonkeyPatch) -> None:
    """The reads in flight when one goes unanswered were begun together: they time out together, and the reads not
    begun are not made (kept `api_unanswered`, as a read unanswered before them keeps them), so the sweep waits about
    one read's timeout, whatever the number of nodes; nothing is expired."""
    led, mirror, w = watched
    monkeypatch.setattr(pod_watch, "API_HOLDS_READ_S", 0.3)
    live(w)
    nodes = {f"q{i:02d}": 1 for i in range(API_HOLDS_READS + 4)}
    janitor, _ = await due_bookings(led, mirror, w, nodes)
    api = GatedApi(w, len(nodes) + 1)  # never full: no read is answered
    before = kept("api_unanswered")
    assert await janitor.sweep() == []
    assert len(api.asked) == API_HOLDS_READS, (
        f"{len(api.asked)} pods read of an API server that answers none; the first {API_HOLDS_READS} were begun "
        f"together, and once they went unanswered the rest was kept unread")
    assert kept("api_unanswered") == before + len(nodes)
    for n in nodes:
        snap = await led.snapshot(n)
        assert snap is not None and len(snap.reservations) == 1


async def test_no_pod_is_read_once_the_view_went_blind_while_the_sweep_looked_at_the_nodes(
        watched: tuple[Ledger, Mirror, PodWatcher]) -> None:
    """The nodes' pods are read once every node was looked at (its records confirmed: before_expire), which leaves a
    moment for the pod view to go blind before the reads: none is made then (no read while blind), nothing is
    expired, and the bookings are expired by a later sweep once the view is live."""
    led, mirror, w = watched
    live(w)
    nodes = {f"b{i}": 1 for i in range(3)}
    janitor, uids = await due_bookings(led, mirror, w, nodes)
    api = GatedApi(w, 1)
    blind_reads: list[str] = []
    get_pod = api.get_pod

    async def read(namespace: str, name: str) -> dict[str, Any]:
        if janitor.view_problem():
            blind_reads.append(f"{namespace}/{name}")
        return await get_pod(namespace, name)

    w.kube.get_pod = read  # type: ignore[method-assign]
    confirm = janitor.before_expire
    assert confirm is not None
    looked: list[list[str]] = []

    async def before_expire(uids: list[str]) -> Any:
        looked.append(uids)
        if len(looked) == len(nodes):  # the last node: the pod stream fails now
            w.reflector._failing(OSError("Cannot connect to host apiserver:6443"))
        return await confirm(uids)

    janitor.before_expire = before_expire
    gone = await janitor.sweep()
    assert len(looked) == len(nodes)
    assert not blind_reads, f"pods read while the pod view was blind: {blind_reads} (expired: {gone})"
    live(w)
    assert sorted(gone + await janitor.sweep()) == sorted(uids)
