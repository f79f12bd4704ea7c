"""Review of the node watcher's coalescing (controller/node_watch.py run_events): a handling that fails for a reason
no retry cures soon (a Redis refusal of one node's write, a bug on one Node's shape).

Handled by the reflector, such an event was tried 5 times and then the stream listed again (the list's view written
whole): the process lived on. Through the queue, the failed node was put back first in line, ready at once, and the
task raised: the supervisor restarted it within a second or two, it took the same node first again, and after 5
failures in a row the role gave up (the process exited), every other node's change waiting behind the one node
meanwhile. Now such a failure waits its node's turn (once per interval), the other nodes are handled, the task runs on,
and readiness names the node's change not handled until one of its states is. Here every write of the node is refused,
closing it too; a node that can be closed is, and leaves readiness alone (test_review_node_stuck_closed.py).

Counted, never timed: the test's clock stands still but for its ticks. Real parts: redis-server, the product's
Ledger, NodeWatcher, its Reflector's event path and the role's Supervisor.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis import exceptions as rexc

from shared.domain.node import Inventory, node_inventory
from shared.serving.supervise import Supervisor, cancel_and_wait
from shared.store.ledger import Ledger
from tests._wait import eventually
from tests.redis.test_redteam_node_event_flood import Rig, stream
from tests.redis.test_redteam_node_health import CFG, gpu_node

pytestmark = pytest.mark.redis


@pytest.fixture
async def poisoned(ledger: Ledger) -> AsyncIterator[tuple[Rig, Supervisor, list[int]]]:
    """The flood test's rig, its worker under the role's Supervisor (quick backoff), every write of node "hot"
    refused as BADINPUT (not transient) while `tries` is counted."""
    rig = Rig(ledger)
    await rig.nodes.on_sync([gpu_node("hot"), gpu_node("calm")])
    rig.nodes.reflector.synced.set()
    rig.nodes.reflector._working()
    tries = [0]
    # every write of hot, closing it too (a node that can be closed: test_review_node_stuck_closed.py)
    for name in ("upsert_node", "replace_node"):
        real = getattr(ledger, name)

        async def refused(inv: Inventory, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
            if inv.node == "hot":
                tries[0] += 1
                raise rexc.ResponseError("BADINPUT cards: refused for this test")
            return await _real(inv, *args, **kwargs)

        setattr(ledger, name, refused)
    sup = Supervisor(max_backoff=0.05, healthy_after=60.0)
    sup.spawn("node-events", rig.nodes.run_events)
    try:
        yield rig, sup, tries
    finally:
        assert not await sup.cancel()


async def test_a_node_whose_handling_keeps_failing_neither_ends_the_role_nor_holds_the_others(
        poisoned: tuple[Rig, Supervisor, list[int]]) -> None:
    rig, sup, tries = poisoned
    nodes = rig.nodes
    await stream(nodes, "MODIFIED", gpu_node("hot", cards=7))
    await stream(nodes, "MODIFIED", gpu_node("calm", cards=7))
    calm = node_inventory(gpu_node("calm", cards=7), CFG)
    await eventually(lambda: sup.failed.is_set() or nodes.last.get("calm") == calm, what="calm handled, or gave up")
    assert not sup.failed.is_set(), f"the role gave up: {sup.fatal}"
    assert tries[0] >= 1
    # the failing node is tried again in its turn, as often as the supervisor would have restarted the task, and more
    for _ in range(8):
        before = tries[0]
        rig.tick(1.0)
        await eventually(lambda b=before: sup.failed.is_set() or tries[0] > b, what="hot tried again, or gave up")
        assert not sup.failed.is_set(), f"the role gave up: {sup.fatal}"
    assert nodes.problem(0).startswith("nodes: 1 node change(s) not handled"), nodes.problem(0)
    # another node handled meanwhile does not make the failing one look handled
    await stream(nodes, "MODIFIED", gpu_node("calm", cards=6))
    rig.tick(1.0)
    await eventually(lambda: nodes.last.get("calm") == node_inventory(gpu_node("calm", cards=6), CFG),
                     what="calm's later change handled")
    assert nodes.problem(0).startswith("nodes: 1 node change(s) not handled"), nodes.problem(0)
    # a newer state of the node that can be written supersedes the failing one: handled, and the view is live again
    ledger = nodes.ledger
    ledger.upsert_node = type(ledger).upsert_node.__get__(ledger)  # type: ignore[method-assign]
    ledger.replace_node = type(ledger).replace_node.__get__(ledger)  # type: ignore[method-assign]
    await stream(nodes, "MODIFIED", gpu_node("hot", cards=5))
    rig.tick(1.0)
    await eventually(lambda: nodes.last.get("hot") == node_inventory(gpu_node("hot", cards=5), CFG),
                     what="hot's newest state handled")
    await eventually(lambda: not nodes.problem(0), what="the view live again")
    snap = await ledger.snapshot("hot")
    assert snap is not None and len(snap.cards) == 5
    assert not sup.failed.is_set()


async def test_a_node_whose_writes_fail_while_the_others_work_does_not_hold_them(ledger: Ledger) -> None:
    """Its failure transient (one shard of a Redis Cluster away, say): put back first in line and ready at once, it
    was taken first again at each restart of the task, and every other node's change waited behind it as long as
    the shard was away."""
    rig = Rig(ledger)
    await rig.nodes.on_sync([gpu_node("hot"), gpu_node("calm")])
    rig.nodes.reflector.synced.set()
    rig.nodes.reflector._working()
    nodes = rig.nodes
    real = ledger.upsert_node

    async def shard_away(inv: Inventory, *args: Any, **kwargs: Any) -> int:
        if inv.node == "hot":
            raise ConnectionError("the shard of hot's keys is away")
        return await real(inv, *args, **kwargs)

    ledger.upsert_node = shard_away  # type: ignore[method-assign]
    rig.start()
    try:
        await stream(nodes, "MODIFIED", gpu_node("hot", cards=7))
        await eventually(lambda: rig.tasks[-1].done(), what="hot's handling failed, the task with it")
        await stream(nodes, "MODIFIED", gpu_node("calm", cards=7))
        rig.start()  # as the supervisor restarts it
        calm = node_inventory(gpu_node("calm", cards=7), CFG)
        await eventually(lambda: rig.tasks[-1].done() or nodes.last.get("calm") == calm,
                         what="calm handled, or the task failed again")
        assert nodes.last.get("calm") == calm, "calm's change waited behind hot's"
        assert len(nodes.events) == 1 and nodes.problem(0).startswith("nodes: 1 node change(s) not handled")
        ledger.upsert_node = real  # type: ignore[method-assign]
        rig.tick(1.0)  # its turn again
        await eventually(lambda: nodes.last.get("hot") == node_inventory(gpu_node("hot", cards=7), CFG),
                         what="hot handled once its shard is back")
        assert not nodes.problem(0)
    finally:
        assert not await cancel_and_wait(rig.tasks)
        for t in rig.tasks:
            if not t.cancelled():
                t.exception()
