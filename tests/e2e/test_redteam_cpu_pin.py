"""Red team (Kubernetes 1.36 pod surfaces), on the real control plane with the chart's policy and our roles: a
tenant who may only create and patch pods in its own namespace closed any GPU node to every slice pod. A CPU pod
(no mthreads resource: neither the admission policy nor the webhook has anything to judge) placed on a GPU node
by the default scheduler, carrying a card pin (`mtsched.io/card-memory`) that names no model, at creation or
annotated later: the watchers could not read "its request" (the pin does not parse), counted that as asking for
cards without a record, and quarantined the node. A pod that names none of our resources holds no card
(shared/domain/trust.py asks_slices, controller/pod_watch.py unaccounted)."""

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
from shared.kube import Kube
from tests.e2e._wait import until
from tests.e2e.test_product import CORE, MEM, VGPU, Cluster
from tests.e2e.test_trust import metric

pytestmark = pytest.mark.e2e
PIN = "mtsched.io/card-memory"
SMP = "application/strategic-merge-patch+json"


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
