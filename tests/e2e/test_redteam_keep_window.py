"""Red team: the reconciler drops a bound reservation it never judged, when its pass is slow.

docs/architecture.md ("The ledger heals itself") promises that a reservation no live holder explains is
only a *suspect*, confirmed with the API server before it is dropped, "so a lagging watch never frees a
card a running pod holds", and that reservations younger than 10 s "are newer than any view and never
judged".

But the 10 s keep window is measured when `replace_node` runs, not when the pass read the ledger:
`reconcile_all` reads every node's snapshot once, then walks the nodes, asking the API server about each
suspect (one GET each). When those GETs are slow (an API server under load, APF queueing), a
reservation booked *after* the read is in no snapshot - so it is never a suspect and never confirmed -
and by the time its node's `replace_node` runs it may be older than 10 s: `replace_node` then drops it
because the (lagging) view does not list its pod. The card a running pod holds looks free and the
extender can book it again: over-commit.

Real parts: kube-apiserver + etcd (this module's own plane: its API server is paused with SIGSTOP to make
the GETs slow), a real redis-server, the product's Ledger, NodeWatcher, PodWatcher and Reconciler. The
watchers' view is taken by their own list + on_sync and then not advanced (a watch that lags).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from redis.asyncio import Redis

from controller.node_watch import NodeWatcher
from controller.pod_watch import PodWatcher
from controller.reconciler import Reconciler
from deploy.local import nodes as simulated
from deploy.local.controlplane import ControlPlane
from deploy.local.redis import RedisServer
from shared.config import load_config
from shared.domain.annotations import CardGrant, binding_annotations, device_id, usage_from_annotations
from shared.kube import Kube
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror

pytestmark = [pytest.mark.e2e, pytest.mark.faults]

CFG = load_config(env={}, flags={"memoryPerCard": "96,160", "reconcileSeconds": 5})
KEEP_S = 10.0  # the reconciler's keep window (Reconciler.keep_ms default, docs/architecture.md)


@pytest_asyncio.fixture
async def parts(own_control_plane: ControlPlane, redis_server: RedisServer) -> AsyncIterator[dict[str, Any]]:
    if redis_server.proc is None or redis_server.proc.poll() is not None:
        redis_server.start()
    client = Redis.from_url(redis_server.url, decode_responses=True)
    await client.flushall()
    ledger = Ledger(client)
    await ledger.load_scripts()
    kube = await Kube.create(str(own_control_plane.kubeconfig_path))
    rid = uuid.uuid4().hex[:6]
    ns = f"rt-{rid}"
    await kube.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    names = [f"rt-a-{rid}", f"rt-b-{rid}"]  # reconcile_all walks nodes in this (sorted) order
    for n in names:
        await kube.request("POST", "/api/v1/nodes", simulated.gpu_node(n, 96, 4, labels={"mtsched.io/rt": rid}))
    try:
        yield {"cp": own_control_plane, "kube": kube, "ledger": ledger, "redis": client, "ns": ns, "nodes": names}
    finally:
        apiserver = own_control_plane._procs["kube-apiserver"].popen  # the test's own plane
        os.kill(apiserver.pid, signal.SIGCONT)  # never leave it paused
        for n in names:
            await kube.request("DELETE", f"/api/v1/nodes/{n}", ok=(200, 202, 404))
        await kube.close()
        await client.aclose()


def bound_pod(name: str, node: str, card: int, mib: int, cores: int) -> dict[str, Any]:
    """A pod bound to `node` with the allocation record the extender writes at bind."""
    ann = binding_annotations(node, [[CardGrant(device_id(node, card), mib, cores)]], time.time_ns())
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": ann, "labels": {"mtsched.io/webhook": "ignore"}},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "c", "image": "busybox"}]}}


async def test_a_reservation_booked_during_a_slow_pass_is_not_dropped_unjudged(parts: dict[str, Any]) -> None:
    kube: Kube = parts["kube"]
    ledger: Ledger = parts["ledger"]
    ns: str = parts["ns"]
    node_a, node_b = parts["nodes"]

    # The watchers' view: one list of nodes and pods, handed to on_sync as after a (re-)list; the streams
    # are then not read (they lag).
    nodes = NodeWatcher(kube, ledger, CFG)
    pods = PodWatcher(kube, ledger, Mirror(ledger), CFG, nodes.lost)
    nodes.holders = pods.holders
    node_objs, _ = await nodes.reflector.list()
    await nodes.on_sync([n for n in node_objs if n["metadata"]["name"] in (node_a, node_b)])
    await pods.on_sync((await pods.reflector.list())[0])
    reconciler = Reconciler(kube, ledger, CFG, nodes, pods)

    # Node A: a reservation of a pod that does not exist, older than the keep window: a suspect, whose
    # confirmation (GET) is what makes the pass slow.
    ok, _ = await ledger.reserve(node_a, "ghost-uid", [1], 4, 1, 1, pod=f"{ns}/ghost")
    assert ok.ok
    assert await ledger.mark_bound(node_a, "ghost-uid")
    # Node B: a small out-of-band drift (a card's usage off by 2 units), so the pass repairs node B too.
    await parts["redis"].hincrby(f"mt:{{{node_b}}}:card:3", "mem_used", 2)
    await asyncio.sleep(KEEP_S + 0.5)

    # Pod P, bound to node B with its record; the lagging view does not know it yet.
    created = await kube.request("POST", f"/api/v1/namespaces/{ns}/pods", bound_pod("p", node_b, 0, 16 * 1024, 4))
    usage = usage_from_annotations(created)
    assert usage is not None
    uid = created["metadata"]["uid"]

    apiserver = parts["cp"]._procs["kube-apiserver"].popen
    os.kill(apiserver.pid, signal.SIGSTOP)  # the API server answers slowly (here: not for a while)
    try:
        pass_task = asyncio.create_task(reconciler.reconcile_all())
        await asyncio.sleep(1.0)  # the pass has read the ledger and waits on its GET about the ghost
        assert not pass_task.done()
        # P's reservation, booked and bound as the extender does (reserve at filter, mark_bound at bind),
        # after the pass read the ledger: in no snapshot, so never a suspect.
        ok, _ = await ledger.reserve(node_b, uid, list(usage.cards), usage.memory, usage.cores, usage.slices,
                                     pod=f"{ns}/p")
        assert ok.ok
        assert await ledger.mark_bound(node_b, uid)
        await asyncio.sleep(KEEP_S + 1.0)
    finally:
        os.kill(apiserver.pid, signal.SIGCONT)
    repaired = await asyncio.wait_for(pass_task, 60)

    snaps = await ledger.snapshots([node_a, node_b])
    assert "ghost-uid" not in snaps[node_a].reservations  # the pass did its job on node A
    assert repaired, "the pass repaired nothing on node B (the test did not exercise the path)"
    # Pod P is bound with a record: the ledger must still book it, and its card must not look free.
    pod = await kube.get_pod(ns, "p")
    assert pod["spec"]["nodeName"] == node_b and pod["metadata"]["uid"] == uid
    assert uid in snaps[node_b].reservations, (
        f"the reconciler dropped the reservation of running pod {ns}/p (bound to {node_b}, record intact), "
        f"booked {KEEP_S + 1:.0f}s after its pass read the ledger and never confirmed with the API server; "
        f"card 0 of {node_b} now books {snaps[node_b].cards[0].mem_used} units")
