"""Red team, on the real control plane: native sidecars (init containers with restartPolicy: Always) run
beside the app containers, so a card holds both at once. A tenant's pods with a 32-unit sidecar and a
32-unit app hold 64 units each; kube-scheduler's own node totals count them so too (its PodRequests knows
sidecars), but the ledger booked 32: on a node of two S4000 cards (96 units each) three such pods all bound,
two of them on one card holding 128 units of grants. The third must stay Pending with the card reason.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from deploy.local.controlplane import ControlPlane
from deploy.local.identities import tenant
from deploy.local.redis import RedisServer
from deploy.local.stack import Stack
from shared.domain.annotations import UNIT_MIB
from shared.kube import Kube
from tests.e2e.test_preempt import until
from tests.e2e.test_product import CORE, MEM, VGPU, Cluster, grants

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane, redis_server: RedisServer) -> Iterator[Stack]:
    with Stack(control_plane, redis_server.empty().url, "96").running() as st:
        yield st


def sidecar_pod(cluster: Cluster, name: str) -> dict[str, Any]:
    p = cluster.pod(name, {VGPU: 1, MEM: 32, CORE: 4}, init=[{VGPU: 1, MEM: 32, CORE: 4}])
    p["spec"]["initContainers"][0]["restartPolicy"] = "Always"  # a native sidecar
    return p


async def test_sidecar_pods_never_overbook_a_card(cluster: Cluster, stack: Stack) -> None:
    node = await cluster.add_node(96, cards=2)
    ident = await asyncio.to_thread(tenant, stack.cp, cluster.ns, stack.dir / "identities")
    user = await Kube.create(str(ident.kubeconfig))
    try:
        for name in ("a", "b", "c"):
            await user.request("POST", f"/api/v1/namespaces/{cluster.ns}/pods", sidecar_pod(cluster, name))
    finally:
        await user.close()

    async def settled() -> dict[str, dict[str, Any]] | None:
        pods = {n: await cluster.get(n) for n in ("a", "b", "c")}
        bound = [n for n, p in pods.items() if p["spec"].get("nodeName")]
        refused = [e for n in pods for e in await cluster.events(n)
                   if e.startswith("FailedScheduling") and "CardInsufficientMemory" in e]
        return pods if len(bound) == 3 or (len(bound) == 2 and refused) else None

    pods = await until("the three sidecar pods to be placed or refused", settled)
    held: Counter[str] = Counter()  # card -> units granted to containers that run at once
    for p in pods.values():
        if p["spec"].get("nodeName"):
            for container in grants(p):
                for g in container:
                    held[g.device_id] += g.memory_mib // UNIT_MIB
    assert all(units <= 96 for units in held.values()), held
    assert sorted(held) == [f"{node}-mthreads-0", f"{node}-mthreads-1"] and sum(held.values()) == 128, held
    snap = (await cluster.snapshots())[node]
    assert [c.mem_used for c in snap.cards.values()] == [64, 64]
    assert all(r.slices == 2 for r in snap.reservations.values())
