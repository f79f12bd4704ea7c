"""Review of the node watcher's coalescing: its `node-events` task (NodeWatcher.run_events) is a supervised task that
fails on Redis, and had no progress hook (Supervisor.progress).

Before, Node events were handled in the node stream's task, which caught a handler's failure itself and never failed
its task. Now a handling that fails while Redis is frozen (each send waits out the socket timeout and the ledger's
resends, so the task has run a while when it fails) fails `node-events` slowly; three such failures make the watcher
unready, and that lasted `proven_after` (60 s) after Redis answered, its handlings working notwithstanding, the stamp
the extenders check not written meanwhile (docs/runbooks.md, "Redis stops answering": ready again within 11 s).
Now each handling that works is progress, as for the role's other tasks that fail on Redis.

Counted, never timed: the supervisor counts a run as "a while" at 0.05 s (and as proven after an hour), and the
failing write waits until the supervisor says the task ran a while. Real parts: redis-server, the product's Ledger,
NodeWatcher and its Reflector's event path, the Supervisor, wired as `run_watcher` wires it.
"""

from __future__ import annotations

from typing import Any

import pytest

from controller.node_watch import NodeWatcher
from controller.roles import spawn_node_events
from shared.domain.node import Inventory, node_inventory
from shared.serving.supervise import Supervisor
from shared.store.ledger import Ledger
from tests._wait import eventually
from tests.redis.test_redteam_node_event_flood import stream
from tests.redis.test_redteam_node_health import CFG, NoKube, gpu_node

pytestmark = pytest.mark.redis


async def test_node_events_is_ready_again_at_its_first_handling_that_works(ledger: Ledger) -> None:
    nodes = NodeWatcher(NoKube(), ledger, CFG)  # type: ignore[arg-type]
    await nodes.on_sync([gpu_node("calm")])
    nodes.reflector.synced.set()
    nodes.reflector._working()
    sup = Supervisor(healthy_after=0.05, proven_after=3600.0, max_backoff=0.05)
    sup.check("nodes", nodes.problem)
    real = ledger.upsert_node
    frozen = [True]

    async def slow_then_away(inv: Inventory, *args: Any, **kwargs: Any) -> int:
        task = sup.tasks["node-events"]
        if frozen[0]:
            # Redis frozen: the send fails only after a while (the task has run `healthy_after` by then)
            await eventually(lambda: task.failing_since is None, what="the task ran a while")
            raise ConnectionError("Redis frozen")
        return await real(inv, *args, **kwargs)

    ledger.upsert_node = slow_then_away  # type: ignore[method-assign]
    spawn_node_events(sup, nodes)
    try:
        await stream(nodes, "MODIFIED", gpu_node("calm", cards=7))
        task = sup.tasks["node-events"]
        await eventually(lambda: task.slow_failures >= 3, what="node-events failed slowly three times")
        assert any("node-events" in p for p in sup.problems()), sup.problems()
        frozen[0] = False  # Redis answers again
        await eventually(lambda: nodes.last.get("calm") == node_inventory(gpu_node("calm", cards=7), CFG),
                         what="the change handled")
        await eventually(lambda: not sup.problems(), what=f"ready again (unready for: {sup.problems()})")
    finally:
        assert not await sup.cancel()
