"""Red team (a node's cards changing under bound pods), on the fault matrix of test_faults.py: the whole stack
(real etcd, kube-apiserver, kube-scheduler, redis-server; 2 watchers, 2 extenders, 2 webhooks) places a burst of
200 mixed pods while a node where pods hold cards changes its cards under them, then a follow-up burst; every
promise of the matrix is checked (no over-committed card, no pod bound without a record, the ledger equals the
API's truth within the documented bound, nothing left once every pod is gone).

* the held node's device plugin reports one card's devices unhealthy (allocatable one card below capacity), then
  healthy again: no card of it is offered meanwhile, what its pods hold is kept;
* the held node shrinks from 4 cards to 2 (capacity and its `mthreads.com/sgpu.cores` label), its pods on cards 2
  and 3 still running, then grows back: the cards come back with what those pods hold;
* a held S4000 node is deleted and created again under the same name as 2 S5000 cards of other ids.
"""

from __future__ import annotations

import pytest

from deploy.local import nodes as simulated
from tests.e2e import test_faults as faults
from tests.e2e.test_faults import LABEL, Scene, put_status, run

# the fault matrix's fixtures (a stack of this module's own, module-scoped as there)
redis_fault_server = faults.redis_fault_server
fault_stack = faults.fault_stack
scene = faults.scene

pytestmark = [pytest.mark.e2e, pytest.mark.faults]
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


async def test_a_held_s4000_node_recreated_as_2_s5000_cards_of_other_ids_under_a_burst(scene: Scene) -> None:
    """The same name, other hardware: deleted and created again with 2 S5000 cards numbered 4 and 5; the pods on
    its old cards 0-3 (still bound, as in the window before the pod garbage collector) keep them booked as removed,
    the new cards take new pods."""
    async def held_s4000() -> str:
        found: list[str] = []

        async def any_held() -> bool:
            snaps = await scene.ledger.snapshots(scene.nodes)
            found[:] = [n for n, s in snaps.items() if n.startswith("s4000") and s.reservations]
            return bool(found)

        await scene.until(any_held, "pods hold cards on an S4000 node", 180)
        return found[0]

    chosen: list[str] = []

    async def fault() -> None:
        name = chosen[0] if chosen else await held_s4000()
        chosen[:] = [name]
        await scene.kube.request("DELETE", f"/api/v1/nodes/{name}", ok=(200, 202))

        async def offers_nothing() -> bool:
            s = (await scene.ledger.snapshots([name])).get(name)
            return s is None or not s.card_states()

        await scene.until(offers_nothing, f"{name} offers no card while deleted", 30)
        node = simulated.gpu_node(name, 160, 2, card_ids=[4, 5], labels={LABEL: scene.id})
        scene.nodes[name] = node  # the truth the checks compare with
        await scene.kube.request("POST", "/api/v1/nodes", node)

        async def recreated() -> bool:
            s = (await scene.ledger.snapshots([name])).get(name)
            return s is not None and sorted((c.card.index, c.card.capacity) for c in s.card_states()) == [
                (4, 160), (5, 160)]

        await scene.until(recreated, f"{name} offers its 2 S5000 cards", 30)

    await run(scene, "recreated as other cards", fault)
