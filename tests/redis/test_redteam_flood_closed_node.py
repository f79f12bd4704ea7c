"""Red team (floods): a node that stops reporting cards under running pods rewrote the ledger at every Node event.

"Heartbeats and unrelated status changes don't touch the ledger" (NodeWatcher.apply) held for nodes that offer
cards or report an error, not for one whose sliced resources are gone while pods still hold cards there (its
device plugin uninstalled, its capacity 0): every later event of that Node (the kubelet's status updates, a label
or annotation anyone writes) logged the same warning again and sent a whole `replace_node` (a Lua rewrite of every
key of the node, and a `rebuild` notice that makes every mirror of every replica read the node again), for as long
as the pods ran. Now such a node is written once per change of what it holds, like any other.

Real parts: redis-server, the product's Ledger and NodeWatcher; the API is the watcher's own events.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from controller.node_watch import NodeWatcher
from shared.domain.annotations import PodUsage
from shared.store.ledger import Ledger
from tests.redis.test_redteam_node_health import CFG, NoKube, gpu_node

pytestmark = pytest.mark.redis


async def test_a_node_without_cards_under_held_pods_is_written_once_not_per_event(
        ledger: Ledger, caplog: pytest.LogCaptureFixture) -> None:
    w = NodeWatcher(NoKube(), ledger, CFG)  # type: ignore[arg-type]
    held = {"u5": (PodUsage("h", (5,), 96, 16, 1), "ns/p5")}
    w.holders = lambda node: dict(held) if node == "h" else {}
    await w.on_event("ADDED", gpu_node("h"))
    writes: list[str] = []
    replace = ledger.replace_node

    async def counted(inv: Any, *args: Any, **kwargs: Any) -> Any:
        writes.append(inv.node)
        return await replace(inv, *args, **kwargs)

    ledger.replace_node = counted  # type: ignore[method-assign]
    gone = {"metadata": {"name": "h", "resourceVersion": "7"}, "status": {"capacity": {"cpu": "64"}}}
    caplog.set_level(logging.WARNING, "mtsched.watchers")
    await w.on_event("MODIFIED", gone)  # the plugin went: cards no longer reported, a pod still holds card 5
    assert writes == ["h"]
    snap = await ledger.snapshot("h")
    assert snap is not None and snap.cards[5].health == "removed" and "u5" in snap.reservations
    for rv in range(8, 18):  # its status updates, while the pod runs
        await w.on_event("MODIFIED", {**gone, "metadata": {"name": "h", "resourceVersion": str(rv)}})
    assert writes == ["h"], f"{len(writes)} rewrites of the node for events that changed nothing"
    assert sum("reports no sliced card" in r.getMessage() for r in caplog.records) == 1
