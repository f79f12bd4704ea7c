"""Red team (what a pod creator can do where no webhook looks): a namespace left out of the webhook (labelled
`hami.io/webhook: ignore`, outside `namespaceSelector`, or in `whitelistNamespaces`) is labelled by whoever
*creates* it, not only by whoever may update Namespaces. A slice pod there is neither mutated nor validated,
and the admission policy judged only records and a preset spec.nodeName: a pod asking `sgpu-memory`/`sgpu-core`
without `vgpu` kept `default-scheduler`, which places it by the node's allocatable, and the vendor plugin then
hands it card memory nobody booked (the watchers close the node to every slice pod while it runs). Another
scheduler's name went through the same way.

Now the policy refuses, in every namespace, a pod asking for slices that is not routed to our scheduler; a pod
that names it is placed by our extender, whose rules hold whatever the webhook saw.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from deploy.local import nodes as simulated
from deploy.local.controlplane import ControlPlane
from deploy.local.redis import RedisServer
from deploy.local.stack import Stack
from shared.domain.annotations import ALLOCATED
from shared.kube import Kube, KubeError
from tests.e2e._wait import until

pytestmark = pytest.mark.e2e

POLICY = "ValidatingAdmissionPolicy 'hami-allocation-records'"
IGNORE = {"hami.io/webhook": "ignore", "mtsched.io/webhook": "ignore"}  # the chart's label; the harness's
LABEL = "mtsched.io/e2e-ignored-ns"


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane, redis_server: RedisServer) -> Iterator[Stack]:
    with Stack(control_plane, redis_server.empty().url, "96").running() as st:
        yield st


def pod(name: str, limits: dict[str, str], run: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeSelector": {LABEL: run},
                     "containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}], **spec}}


async def test_a_slice_pod_where_no_webhook_looks_must_name_our_scheduler(stack: Stack, admin: Kube) -> None:
    run = uuid.uuid4().hex[:6]
    ns, node = f"e2e-ignored-{run}", f"s4000-ignored-{run}"
    # whoever creates a namespace sets its labels
    await admin.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns, "labels": IGNORE}})
    await admin.request("POST", "/api/v1/nodes", simulated.gpu_node(node, 96, 2, labels={LABEL: run}))
    pods = f"/api/v1/namespaces/{ns}/pods"
    try:
        units_only = {"mthreads.com/sgpu-memory": "32", "mthreads.com/sgpu-core": "4"}
        slice_ = {"mthreads.com/vgpu": "1", **units_only}
        for what, body in {
            "card units without vgpu, default scheduler": pod("units", units_only, run),
            "a slice, default scheduler named": pod("named", slice_, run, schedulerName="default-scheduler"),
            "a slice, another scheduler": pod("other", slice_, run, schedulerName="volcano"),
            "an init container's slice": {**pod("init", {"cpu": "100m"}, run), "spec": {
                **pod("init", {"cpu": "100m"}, run)["spec"],
                "initContainers": [{"name": "i", "image": "busybox", "resources": {"limits": slice_}}]}},
        }.items():
            with pytest.raises(KubeError) as info:
                await admin.request("POST", pods, body)
            msg = str(info.value)
            assert info.value.status == 403 and POLICY in msg, (what, msg)
            assert 'must name schedulerName "hami-scheduler"' in msg, (what, msg)
        # a pod asking for no slice is untouched by it
        await admin.request("POST", pods, pod("cpu", {"cpu": "100m"}, run))
        # one that names our scheduler is placed by our extender and bind, as anywhere else
        await admin.request("POST", pods, pod("ours", slice_, run, schedulerName="hami-scheduler"))

        async def bound() -> dict[str, Any] | None:
            p: dict[str, Any] = await admin.get_pod(ns, "ours")
            return p if p["spec"].get("nodeName") else None

        placed = await until(bound, "ours bound", stack.logs, 30.0)
        assert placed["spec"]["nodeName"] == node and ALLOCATED in placed["metadata"]["annotations"]
    finally:
        await admin.request("DELETE", pods, query={"gracePeriodSeconds": "0"}, ok=(200, 202, 404))
        await admin.request("DELETE", f"/api/v1/nodes/{node}", ok=(200, 202, 404))
        await admin.request("DELETE", f"/api/v1/namespaces/{ns}", ok=(200, 202, 404))
