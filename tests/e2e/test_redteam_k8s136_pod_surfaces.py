"""Red team (Kubernetes 1.33-1.36 pod surfaces), on the real control plane with the chart's policy and our roles:
what the ledger's rules take from the API server, pinned so that a Kubernetes that changes it fails here first.

- Pod-level resources (`spec.resources`, beta and on since 1.34) cannot name our resources, and `spec.overhead`
  comes from a RuntimeClass only: a pod's card resources are its containers' (shared/domain/trust.py asks_slices,
  the policy's and the webhook's match).
- In-place resize (`pods/resize`, GA in 1.35; sidecars and, since 1.36, init containers too) changes cpu and
  memory only, for the cluster admin as for anyone: what was admitted and booked stays what the pod holds.
- Container restart rules (`restartPolicy` on any container, `restartPolicyRules`, beta and on since 1.35): only an
  init container's `restartPolicy: Always` makes a sidecar, held beside the apps (shared/domain/lifecycle.py
  kind_of); an init container with `OnFailure` still runs before them, and is booked so.
The tenant may only create, read, change and delete pods in its own namespace."""

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
from shared.kube import Kube, KubeError
from tests.e2e.test_product import CORE, MEM, VGPU, Cluster

pytestmark = pytest.mark.e2e
SMP = "application/strategic-merge-patch+json"


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane, redis_server: RedisServer) -> Iterator[Stack]:
    with Stack(control_plane, redis_server.empty().url, "96").running() as st:
        yield st


@pytest_asyncio.fixture
async def cluster(stack: Stack) -> AsyncIterator[Cluster]:
    async with Cluster.opened(stack, stack.redis_url) as c:
        yield c


@pytest_asyncio.fixture
async def user(cluster: Cluster, stack: Stack) -> AsyncIterator[Kube]:
    ident = await asyncio.to_thread(tenant, stack.cp, cluster.ns, stack.dir / "identities")
    kube = await Kube.create(str(ident.kubeconfig))
    try:
        yield kube
    finally:
        await kube.close()


async def refused(kube: Kube, method: str, path: str, body: Any, content_type: str = "application/json") -> KubeError:
    with pytest.raises(KubeError) as info:
        await kube.request(method, path, body, content_type=content_type)
    return info.value


async def test_pod_level_resources_and_overhead_cannot_name_our_resources(cluster: Cluster, user: Kube) -> None:
    base = f"/api/v1/namespaces/{cluster.ns}/pods"
    p = cluster.pod("pod-level", {"cpu": "100m"})
    p["spec"]["resources"] = {"limits": {VGPU: "1", MEM: "8", "cpu": "1"}}
    e = await refused(user, "POST", base, p)
    assert e.status == 422 and "spec.resources.limits[mthreads.com/vgpu]: Unsupported value" in str(e), e
    for name, limits in (("cpu-overhead", {"cpu": "100m"}), ("slice-overhead", {VGPU: 1, MEM: 8, CORE: 2})):
        p = cluster.pod(name, limits)
        p["spec"]["overhead"] = {MEM: "8"}
        e = await refused(user, "POST", base, p)
        assert e.status == 403 and "Pod Overhead set without corresponding RuntimeClass" in str(e), (name, e)


async def test_resize_changes_no_card_resource_of_an_app_or_a_sidecar(cluster: Cluster) -> None:
    await cluster.add_node(96, cards=2)
    p = cluster.pod("resized", {VGPU: 1, MEM: 8, CORE: 2}, init=[{VGPU: 1, MEM: 8, CORE: 2}])
    p["spec"]["initContainers"][0]["restartPolicy"] = "Always"  # a sidecar: resizable since 1.33
    await cluster.create(p)
    await cluster.wait_bound("resized")
    path = f"/api/v1/namespaces/{cluster.ns}/pods/resized/resize"
    for field, name, why in (("containers", "c0", "only cpu and memory resources are mutable"),
                             ("initContainers", "init0",
                              "only cpu and memory resources for init or sidecar containers are mutable")):
        body = {"spec": {field: [{"name": name, "resources": {"limits": {MEM: "64"}, "requests": {MEM: "64"}}}]}}
        e = await refused(cluster.kube, "PATCH", path, body, SMP)  # the cluster admin
        assert e.status == 422 and why in str(e), (field, e)
    got = await cluster.get("resized")
    assert [c["resources"]["limits"][MEM] for c in got["spec"]["initContainers"] + got["spec"]["containers"]] == \
        ["8", "8"]


async def test_only_an_init_containers_always_makes_a_sidecar(cluster: Cluster, user: Kube) -> None:
    node = await cluster.add_node(96, cards=2)
    base = f"/api/v1/namespaces/{cluster.ns}/pods"
    once = cluster.pod("init-on-failure", {VGPU: 1, MEM: 8, CORE: 2}, init=[{VGPU: 1, MEM: 32, CORE: 4}])
    once["spec"]["initContainers"][0]["restartPolicy"] = "OnFailure"  # restart rules: still before the apps
    beside = cluster.pod("sidecar-rules", {VGPU: 1, MEM: 8, CORE: 2}, init=[{VGPU: 1, MEM: 32, CORE: 4}])
    beside["spec"]["initContainers"][0]["restartPolicy"] = "Always"
    beside["spec"]["initContainers"][0]["restartPolicyRules"] = [
        {"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}]
    app = cluster.pod("app-always", {VGPU: 1, MEM: 8, CORE: 2})
    app["spec"]["restartPolicy"] = "Never"
    app["spec"]["containers"][0]["restartPolicy"] = "Always"  # an app container: beside the others anyway
    uids = {}
    for p in (once, beside, app):
        uids[p["metadata"]["name"]] = (await user.request("POST", base, p))["metadata"]["uid"]
    await cluster.wait_bound(*uids)
    snaps = await cluster.wait_ledger(lambda s: all(
        u in s[node].reservations and s[node].reservations[u].state == "bound" for u in uids.values()))
    booked = {n: (r.mem, r.cores, r.slices) for n, u in uids.items() for r in [snaps[node].reservations[u]]}
    assert booked == {"init-on-failure": (32, 4, 1), "sidecar-rules": (40, 6, 2), "app-always": (8, 2, 1)}, booked
