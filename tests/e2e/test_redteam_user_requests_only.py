"""Red team (what a demanding user writes): `mthreads.com/vgpu` under `requests` only.

HAMi's own table has it ("count one requested without limits": the webhook fills in the whole card) and the
webhook admitted it, filling `sgpu-memory`/`sgpu-core` into limits, but not the count: the API server then
refused the pod with `spec.containers[0].resources.limits: Required value: Limit must be set for non
overcommitable resources`, naming no resource. An extended resource's limit must equal its request, so the
webhook now writes the count into limits too, and the pod is created as HAMi's table says.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from deploy.local.controlplane import ControlPlane
from deploy.local.redis import RedisServer
from deploy.local.stack import Stack
from shared.kube import Kube

pytestmark = pytest.mark.e2e

VGPU, MEM, CORE = "mthreads.com/vgpu", "mthreads.com/sgpu-memory", "mthreads.com/sgpu-core"


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane, redis_server: RedisServer) -> Iterator[Stack]:
    with Stack(control_plane, redis_server.empty().url, "96").running() as st:
        yield st


async def test_a_count_under_requests_only_is_created_as_hamis_table_says(stack: Stack) -> None:
    kube = await Kube.create(str(stack.cp.kubeconfig_path))
    ns = f"e2e-reqonly-{uuid.uuid4().hex[:6]}"
    try:
        await kube.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})

        async def create(name: str, resources: dict[str, Any]) -> dict[str, Any]:
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                   "spec": {"nodeSelector": {"mtsched.io/nowhere": "x"},  # stays Pending: only admission is tested
                            "containers": [{"name": "m", "image": "busybox", "resources": resources}]}}
            got = await kube.request("POST", f"/api/v1/namespaces/{ns}/pods", pod)
            out: dict[str, Any] = got["spec"]["containers"][0]["resources"]
            return out

        exclusive = await create("exclusive", {"requests": {VGPU: "1"}})
        assert exclusive["limits"] == {VGPU: "1", MEM: "96", CORE: "16"} == exclusive["requests"], exclusive
        multi = await create("multi", {"requests": {VGPU: "2"}})
        assert multi["limits"] == {VGPU: "2", MEM: "192", CORE: "32"} == multi["requests"], multi
        sliced = await create("slice", {"requests": {VGPU: "1"}, "limits": {MEM: "32", CORE: "4"}})
        assert sliced["limits"] == {VGPU: "1", MEM: "32", CORE: "4"} == sliced["requests"], sliced
    finally:
        await kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods", query={"gracePeriodSeconds": "0"},
                           ok=(200, 202, 404))
        await kube.request("DELETE", f"/api/v1/namespaces/{ns}", ok=(200, 202, 404))
        await kube.close()
