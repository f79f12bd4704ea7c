"""Red team (Kubernetes 1.36, on the real control plane with the chart's policy and our roles): a tenant who may only
create and patch pods in its own namespace closed a GPU node to every slice pod, and opened it again, at will, with
the card pin (`mtsched.io/card-memory`) of one of its own pods, an annotation its owner may change any time (no
admission looks at a pod UPDATE). The watchers could not read "its request", counted that as asking for cards
without a readable record, and quarantined the node:

1. A CPU pod (no mthreads resource: neither the admission policy nor the webhook has anything to judge) placed on
   a GPU node by the default scheduler, its pin naming no model, at creation or annotated later. A pod that names
   none of our resources holds no card (shared/domain/trust.py asks_slices, controller/pod_watch.py unaccounted).
2. A slice pod our bind never placed: bound by another scheduler before the chart's policy existed (HAMi under
   another schedulerName, or a cluster that ran without the policy), carrying the `mthreads.com/gpu-index` its
   binder wrote. The watchers book it from what survives on it (the cards gpu-index names, the amounts its request
   implies: shared/domain/reconcile.py recovered_usage); a pin naming no model, or a model its slice does not fit,
   made that request unreadable. What a placed pod holds does not depend on which model it asked to be placed on
   (shared/domain/request.py held_request)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio

from deploy.local.controlplane import ControlPlane
from deploy.local.identities import tenant
from deploy.local.redis import RedisServer
from deploy.local.stack import Stack
from shared.domain.annotations import GPU_INDEX
from shared.domain.state import NodeSnapshot
from shared.kube import Kube
from tests.e2e._wait import until
from tests.e2e.test_product import CORE, MEM, VGPU, Cluster
from tests.e2e.test_trust import metric

pytestmark = pytest.mark.e2e
PIN = "mtsched.io/card-memory"
SMP = "application/strategic-merge-patch+json"
IGNORE = {"hami.io/webhook": "ignore", "mtsched.io/webhook": "ignore"}  # the chart's label; the harness's


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane, redis_server: RedisServer) -> Iterator[Stack]:
    with Stack(control_plane, redis_server.empty().url, "96", settings={"reconcileSeconds": 2}).running() as st:
        yield st


@pytest_asyncio.fixture
async def cluster(stack: Stack) -> AsyncIterator[Cluster]:
    async with Cluster.opened(stack, stack.redis_url) as c:
        yield c


def cpu_pod(name: str, node: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": annotations or {}},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                     "containers": [{"name": "c", "image": "busybox",
                                     "resources": {"limits": {"cpu": "100m", "memory": "64Mi"}}}]}}


@pytest.mark.parametrize("when", ["at-create", "annotated-after-bind"])
async def test_a_cpu_pods_card_pin_does_not_close_a_gpu_node(cluster: Cluster, stack: Stack, when: str) -> None:
    node = await cluster.add_node(96, cards=2)
    ident = await asyncio.to_thread(tenant, stack.cp, cluster.ns, stack.dir / "identities")
    user = await Kube.create(str(ident.kubeconfig))
    base = f"/api/v1/namespaces/{cluster.ns}/pods"
    try:
        if when == "at-create":
            await user.request("POST", base, cpu_pod("cpu", node, {PIN: "nope"}))
            await cluster.wait_bound("cpu")
        else:
            await user.request("POST", base, cpu_pod("cpu", node))
            await cluster.wait_bound("cpu")
            await user.request("PATCH", f"{base}/cpu", {"metadata": {"annotations": {PIN: "nope"}}},
                               content_type=SMP)
    finally:
        await user.close()
    # Someone else's slice pod, created after it: the watchers read the pod stream in order, so once they have
    # handled the slice pod's record they have handled the tenant's pod; a pass after that has applied any
    # quarantine it implied. (Before: the slice pod stayed Pending, "quarantined: .../cpu bound here asking for
    # cards without a readable allocation record", or the node closed right after.)
    records = metric(stack, "mtsched_records_total")
    await cluster.create(cluster.pod("victim", {VGPU: 1, MEM: 8, CORE: 2}))
    await cluster.wait_bound("victim", timeout=30)

    async def recorded() -> bool | None:
        return True if metric(stack, "mtsched_records_total") > records else None

    await until(recorded, "the watcher handled the slice pod's record", stack.logs, timeout=30)
    runs = metric(stack, "mtsched_reconcile_runs_total")

    async def passed() -> bool | None:
        return True if metric(stack, "mtsched_reconcile_runs_total") >= runs + 2 else None

    await until(passed, "two reconcile passes", stack.logs, timeout=30)
    assert (await cluster.snapshots())[node].error == ""


def migrated_pod(node: str) -> dict[str, Any]:
    """A slice pod another scheduler placed on card 0 of `node` (HAMi writes gpu-index at its bind)."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "migrated", "annotations": {GPU_INDEX: "0"}},
            "spec": {"schedulerName": "hami-v1", "nodeName": node,
                     "containers": [{"name": "c", "image": "busybox", "resources": {"limits": {
                         VGPU: "1", MEM: "8", CORE: "2"}}}]}}


async def passes(stack: Stack, n: int) -> None:
    runs = metric(stack, "mtsched_reconcile_runs_total")

    async def passed() -> bool | None:
        return True if metric(stack, "mtsched_reconcile_runs_total") >= runs + n else None

    await until(passed, f"{n} reconcile passes", stack.logs, timeout=30)


@pytest.mark.parametrize("pin", ["nope", "160"])  # no model at all; a model this cluster has not
async def test_a_tenants_pin_on_a_pod_another_scheduler_placed_closes_no_node(cluster: Cluster, stack: Stack,
                                                                             pin: str) -> None:
    node = await cluster.add_node(96, cards=2)
    ns_path = f"/api/v1/namespaces/{cluster.ns}"
    base = f"{ns_path}/pods"
    # before the chart's policy, where the webhook did not look: another scheduler's slice pod
    await cluster.kube.request("PATCH", ns_path, {"metadata": {"labels": IGNORE}}, content_type=SMP)
    with stack.policy_suspended():
        created = await cluster.kube.request("POST", base, migrated_pod(node))
    await cluster.kube.request("PATCH", ns_path, {"metadata": {"labels": {k: None for k in IGNORE}}},
                               content_type=SMP)
    uid = created["metadata"]["uid"]

    def held(snaps: dict[str, NodeSnapshot]) -> bool:
        s = snaps.get(node)
        return s is not None and s.error == "" and s.cards[0].mem_used == 8

    await cluster.wait_ledger(held, timeout=30)  # booked from gpu-index and its request, the node open

    ident = await asyncio.to_thread(tenant, stack.cp, cluster.ns, stack.dir / "identities")
    user = await Kube.create(str(ident.kubeconfig))
    try:  # the pod's owner: pods in its own namespace only
        await user.request("PATCH", f"{base}/migrated", {"metadata": {"annotations": {PIN: pin}}},
                           content_type=SMP)
    finally:
        await user.close()
    assert (await cluster.get("migrated"))["metadata"]["uid"] == uid
    await passes(stack, 3)
    snap = (await cluster.snapshots())[node]
    assert snap.error == "", snap.error  # (before: "quarantined: .../migrated bound here asking for cards ...")
    assert snap.cards[0].mem_used == 8
    await cluster.create(cluster.pod("victim", {VGPU: 1, MEM: 8, CORE: 2}))
    await cluster.wait_bound("victim", timeout=30)
