"""Red team (a hostile or broken node): one Node object changed in a tight loop held the node watcher's whole core.

The node watcher handled every Node event at once, in order: ~2.4 ms of CPU per event of an 8-card node, 36-41 ms
per event of a node that reports 1024 cards. A flapping kubelet, or anyone holding a node's kubelet identity
patching its own status in a loop, took the watcher's core, and every other node's change (and, in the same
process, the other watchers' work) waited behind it without bound. Now the stream's events are queued per node
(NodeWatcher.offer): a node's burst collapses to its newest state, a node is handled at most once per minimum
interval, and the nodes go in turn (shared/domain/coalesce.py).

Counted, never timed: the test's own clock stands still, so the hot node's interval never ends until it moves it.
Real parts: redis-server, the product's Ledger, NodeWatcher and its Reflector's event path.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest

from controller.node_watch import NodeWatcher
from shared.domain.node import node_inventory
from shared.serving.metrics import WATCH_COALESCED, WATCH_DEFERRED
from shared.serving.supervise import cancel_and_wait
from shared.store.ledger import Ledger
from tests._wait import eventually
from tests.redis.test_redteam_node_health import CFG, NoKube, gpu_node

pytestmark = pytest.mark.redis
BURST = 200


def hot(i: int) -> dict[str, Any]:
    """The hot node's i-th state: 1024 cards, of one model then the other (each change a ledger write)."""
    node = gpu_node("hot", cards=1024, units=160 if i % 2 == 0 else 96)
    node["metadata"]["resourceVersion"] = str(1000 + i)
    return node


def counted(value: Any) -> float:
    return float(value._value.get())


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Rig:
    """A NodeWatcher on the real Ledger, its ledger writes counted by node, its worker run as the role runs it."""

    def __init__(self, ledger: Ledger) -> None:
        self.nodes = NodeWatcher(NoKube(), ledger, CFG, min_interval=1.0)  # type: ignore[arg-type]
        self.clock = Clock()
        self.nodes.clock = self.clock
        self.writes: Counter[str] = Counter()
        self.tasks: list[asyncio.Task[None]] = []

    def count_writes(self) -> None:
        for name in ("upsert_node", "replace_node", "remove_node"):
            real = getattr(self.nodes.ledger, name)

            def spy(first: Any, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
                self.writes[first if isinstance(first, str) else first.node] += 1
                return _real(first, *args, **kwargs)

            setattr(self.nodes.ledger, name, spy)

    def start(self) -> None:
        """The worker (again, as the role's supervisor restarts it after a failure)."""
        self.tasks.append(asyncio.create_task(self.nodes.run_events()))

    def tick(self, seconds: float) -> None:
        self.clock.now += seconds
        self.nodes._offered.set()  # (the worker sleeps on real time: told the clock moved)


@pytest.fixture
async def rig(ledger: Ledger) -> AsyncIterator[Rig]:
    rig = Rig(ledger)
    await rig.nodes.on_sync([gpu_node("hot", cards=1024), gpu_node("calm")])
    rig.nodes.reflector.synced.set()  # (listed, as its run does after on_sync: the stream works)
    rig.nodes.reflector._working()
    rig.count_writes()
    rig.start()
    try:
        yield rig
    finally:
        assert not await cancel_and_wait(rig.tasks)
        for t in rig.tasks:
            if not t.cancelled():
                t.exception()  # (a worker that failed on purpose)


async def stream(nodes: NodeWatcher, kind: str, node: dict[str, Any]) -> None:
    """One event as the node stream delivers it (through the reflector's handling of a watch line)."""
    await nodes.reflector._handle({"type": kind, "object": node})
    await asyncio.sleep(0)  # the worker may run between two events (it gets every chance to)


async def test_a_node_changed_in_a_burst_is_handled_a_bounded_number_of_times(rig: Rig) -> None:
    nodes, writes = rig.nodes, rig.writes
    await stream(nodes, "MODIFIED", hot(0))  # after a quiet spell: handled at once
    await eventually(lambda: nodes.handled == 1, what="the hot node's first change handled")
    coalesced, deferred = counted(WATCH_COALESCED.labels("node")), counted(WATCH_DEFERRED.labels("node"))
    for i in range(1, BURST):
        await stream(nodes, "MODIFIED", hot(i))
    await stream(nodes, "MODIFIED", gpu_node("calm", cards=7))
    calm = node_inventory(gpu_node("calm", cards=7), CFG)
    await eventually(lambda: nodes.handled == 2, what="the calm node's change handled")
    assert nodes.last["calm"] == calm
    snap = await nodes.ledger.snapshot("calm")
    assert snap is not None and len(snap.cards) == 7
    # the hot node: its first change handled at once, every later one of the burst waiting its interval as one
    assert nodes.handled == 2, nodes.handled
    assert writes["hot"] == 1, writes
    assert nodes.last["hot"] == node_inventory(hot(0), CFG)
    assert counted(WATCH_DEFERRED.labels("node")) - deferred == 1
    assert counted(WATCH_COALESCED.labels("node")) - coalesced == BURST - 2
    assert len(nodes.events) == 1
    # its interval over, its newest state is handled (once), nothing older after it
    rig.tick(1.0)
    await eventually(lambda: nodes.handled == 3, what="the hot node's newest change handled")
    assert nodes.last["hot"] == node_inventory(hot(BURST - 1), CFG)
    assert not nodes.events and writes["hot"] == 2, (nodes.events.pending, writes)


async def test_deleted_then_created_again_is_forgotten_then_written_new(rig: Rig) -> None:
    nodes = rig.nodes
    await stream(nodes, "MODIFIED", gpu_node("calm", cards=7))  # handled: calm waits its interval now
    await eventually(lambda: nodes.handled == 1, what="calm handled")
    await stream(nodes, "DELETED", gpu_node("calm", cards=7))
    again = gpu_node("calm", cards=4)
    again["metadata"]["uid"] = "new-uid"
    await stream(nodes, "ADDED", again)
    assert nodes.handled == 1 and len(nodes.events) == 1
    rig.tick(1.0)
    await eventually(lambda: nodes.handled == 3, what="the deletion, then the new node")
    snap = await nodes.ledger.snapshot("calm")
    assert snap is not None and len(snap.cards) == 4, snap
    assert nodes.last["calm"] == node_inventory(again, CFG)


async def test_a_relist_supersedes_the_pending_events(rig: Rig) -> None:
    nodes, writes = rig.nodes, rig.writes
    await stream(nodes, "MODIFIED", hot(0))
    await eventually(lambda: nodes.handled == 1, what="hot handled")
    await stream(nodes, "MODIFIED", hot(1))  # older than the list below: must never be written after it
    assert len(nodes.events) == 1
    await nodes.on_sync([hot(2), gpu_node("calm")])
    assert not nodes.events
    listed = writes["hot"]
    rig.tick(10.0)
    await stream(nodes, "MODIFIED", gpu_node("calm", cards=6))  # a later change: handled after the list
    await eventually(lambda: nodes.handled == 2, what="calm's change handled")
    assert nodes.last["hot"] == node_inventory(hot(2), CFG), "the re-list's view stands"
    assert writes["hot"] == listed, "nothing older written after the re-list"


async def test_a_failed_handling_is_kept_and_the_view_says_so(rig: Rig) -> None:
    nodes = rig.nodes
    ledger = nodes.ledger
    real = ledger.upsert_node

    async def away(*_: Any, **__: Any) -> int:
        raise ConnectionError("Redis away")

    ledger.upsert_node = away  # type: ignore[method-assign]
    await stream(nodes, "MODIFIED", gpu_node("calm", cards=7))
    await eventually(lambda: nodes.failing_since is not None and rig.tasks[0].done(), what="the handling failed")
    assert len(nodes.events) == 1, "kept for the next try"
    assert nodes.problem(0).startswith("nodes: 1 node change(s) not handled")
    ledger.upsert_node = real  # type: ignore[method-assign]
    rig.start()  # as the supervisor restarts it
    rig.tick(1.0)  # (retried in the node's turn, its interval over: not first in line at once)
    await eventually(lambda: nodes.handled == 1, what="handled once Redis is back")
    assert not nodes.problem(0)
    snap = await ledger.snapshot("calm")
    assert snap is not None and len(snap.cards) == 7
