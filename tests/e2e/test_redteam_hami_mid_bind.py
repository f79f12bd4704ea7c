"""Red team (migrating from HAMi v2.10), on the real control plane: a pod HAMi's Filter recorded but its Bind never
bound (HAMi uninstalled between the two, or its Binding failed after `hami.io/bind-phase: allocating`) is Pending
with HAMi's record naming a card it does not hold. Our scheduler must place it like any pod of its name, and the
Binding must leave our record (what the ledger booked), not HAMi's, on the pod (docs/install.md, Migrating from
HAMi)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from deploy.local.controlplane import ControlPlane
from deploy.local.redis import RedisServer
from deploy.local.stack import Stack
from shared.domain.annotations import ALLOCATED, GPU_INDEX, VGPU_NODE
from tests.e2e.test_preempt import until
from tests.e2e.test_product import CORE, MEM, VGPU, Cluster, grants

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane, redis_server: RedisServer) -> Iterator[Stack]:
    with Stack(control_plane, redis_server.empty().url, "96").running() as st:
        yield st


async def test_a_pod_hami_left_mid_bind_is_placed_with_our_record(cluster: Cluster, stack: Stack) -> None:
    node = await cluster.add_node(96, cards=2)
    p = cluster.pod("mid", {VGPU: 1, MEM: 32, CORE: 8})
    p["spec"]["schedulingGates"] = [{"name": "example.com/migration"}]  # held while HAMi's keys are written
    await cluster.create(p)
    path = f"/api/v1/namespaces/{cluster.ns}/pods/mid"
    hami = {ALLOCATED: f"{node}-mthreads-0,Mthreads,49152,16:;", GPU_INDEX: "0", VGPU_NODE: node,
            "hami.io/vgpu-time": "1764979200", "mthreads.com/predicate-node": node,
            "mthreads.com/predicate-time": "1764979200000000000", "hami.io/bind-phase": "allocating",
            "hami.io/bind-time": "1764979200"}
    with stack.policy_suspended():  # HAMi wrote them before the chart's policy existed
        await cluster.kube.request("PATCH", path, {"metadata": {"annotations": hami, "labels": {VGPU_NODE: node}}},
                                   content_type="application/merge-patch+json")
    await cluster.kube.request("PATCH", path, {"spec": {"schedulingGates": None}},
                               content_type="application/merge-patch+json")
    bound = (await cluster.wait_bound("mid"))["mid"]
    ann: dict[str, Any] = bound["metadata"]["annotations"]
    [[g]] = grants(bound)
    assert (g.memory_mib, g.cores) == (32 * 512, 8), ann[ALLOCATED]  # ours, not HAMi's 49152/16
    assert ann[VGPU_NODE] == bound["spec"]["nodeName"] == node and ann[GPU_INDEX] == str(g.index)

    async def booked() -> Any:
        snap = (await cluster.snapshots())[node]
        r = snap.reservations.get(bound["metadata"]["uid"])
        return snap if r is not None and r.state == "bound" else None

    snap = await until("the pod's booking to be bound", booked)
    r = snap.reservations[bound["metadata"]["uid"]]
    assert (r.cards, r.mem, r.cores) == ((g.index,), 32, 8)
    assert sum(c.mem_used for c in snap.cards.values()) == 32  # HAMi's stale 96 units are booked nowhere
