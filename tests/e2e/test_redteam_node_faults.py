"""Red team (a node's cards changing under bound pods), on the fault matrix of test_faults.py: the whole stack
(real etcd, kube-apiserver, kube-scheduler, redis-server; 2 watchers, 2 extenders, 2 webhooks) places a burst of
200 mixed pods while a node where pods hold cards changes its cards under them, then a follow-up burst; every
promise of the matrix is checked (no over-committed card, no pod bound without a record, the ledger equals the
API's truth within the documented bound, nothing left once every pod is gone).

* the held node's device plugin reports one card's devices unhealthy (allocatable one card below capacity), then
  healthy again: no card of it is offered meanwhile, what its pods hold is kept;
* the held node shrinks from 4 cards to 2 (capacity and its `mthreads.com/sgpu.cores` label), its pods on cards 2
  and 3 still running, then grows back: the cards come back with what those pods hold.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e import test_faults as faults
from tests.e2e.test_faults import CORE, MEM, Scene, run

# the fault matrix's fixtures (a stack of this module's own, module-scoped as there)
redis_fault_server = faults.redis_fault_server
fault_stack = faults.fault_stack
scene = faults.scene

pytestmark = [pytest.mark.e2e, pytest.mark.faults]
SLICED_CORES = "mthreads.com/sgpu.cores"


def model_of(name: str) -> int:
    return 160 if name.startswith("s5000") else 96


async def put_status(sc: Scene, name: str, capacity_cards: int, healthy_cards: int, ids: str | None = None) -> None:
    node: dict[str, Any] = await sc.kube.request("GET", f"/api/v1/nodes/{name}")
    m = model_of(name)
    node["status"]["capacity"].update({MEM: str(m * capacity_cards), CORE: str(16 * capacity_cards)})
    node["status"]["allocatable"].update({MEM: str(m * healthy_cards), CORE: str(16 * healthy_cards)})
    node = await sc.kube.request("PUT", f"/api/v1/nodes/{name}/status", node)
    if ids is not None:
        await sc.kube.request("PATCH", f"/api/v1/nodes/{name}", {"metadata": {"labels": {SLICED_CORES: ids}}},
                              content_type="application/merge-patch+json")


async def test_a_card_unhealthy_then_healthy_under_a_burst(scene: Scene) -> None:
    async def fault() -> None:
        name = await scene.held_node()
        await put_status(scene, name, 4, 3)

        async def closed() -> bool:
            s = (await scene.ledger.snapshots([name])).get(name)
            return s is not None and "unhealthy" in s.error and not s.card_states()

        await scene.until(closed, f"{name} offers no card while a card is unhealthy", 30)
        await put_status(scene, name, 4, 4)

    await run(scene, "card unhealthy and back", fault)


async def test_the_node_shrinks_from_4_cards_to_2_and_back_under_a_burst(scene: Scene) -> None:
    async def fault() -> None:
        name = await scene.held_node()
        await put_status(scene, name, 2, 2, ids="0-1")

        async def shrunk() -> bool:
            s = (await scene.ledger.snapshots([name])).get(name)
            return s is not None and not s.error and sorted(c.card.index for c in s.card_states()) == [0, 1]

        await scene.until(shrunk, f"{name} offers cards 0 and 1 only", 30)
        await put_status(scene, name, 4, 4, ids="0-1-2-3")

    await run(scene, "4 cards to 2 and back", fault)
