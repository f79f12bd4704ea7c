"""Red team: a rebuild drops bookings no live pod explains (pods deleted while no watcher ran: a rollout of the
watchers, a crash) and, like a repair, frees their cards. kube-scheduler's retry on those pods' deletion met
the cards still booked and parked the pods our filter refused; nothing nudged it after the rebuild, so they
waited for an unrelated event or its 5-minute flush. The rebuild must nudge every node it freed cards on.

Real parts: redis-server, the product's Ledger, NodeWatcher, PodWatcher and Reconciler; the API client
answers the two lists (one node, no pod)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from controller.node_watch import NodeWatcher
from controller.pod_watch import PodWatcher
from controller.reconciler import Reconciler
from controller.watchers import wire
from shared.config import load_config
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis.test_redteam_inflight_nodes import gpu_node

pytestmark = pytest.mark.redis
CFG = load_config(env={}, flags={"memoryPerCard": "96,160", "reconcileSeconds": "300"})


class Lists:
    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        assert method == "GET", (method, path)
        items = [gpu_node("rb")] if path == "/api/v1/nodes" else []
        return {"items": items, "metadata": {"resourceVersion": "7"}}


async def test_redteam_a_rebuild_that_drops_stale_bookings_nudges_their_node(ledger: Ledger) -> None:
    nodes = NodeWatcher(Lists(), ledger, CFG)  # type: ignore[arg-type]
    await nodes.on_event("ADDED", gpu_node("rb"))
    await nodes.on_event("ADDED", gpu_node("clean"))
    pods = PodWatcher(Lists(), ledger, Mirror(ledger), CFG, nodes.lost)  # type: ignore[arg-type]
    wire(nodes, pods)
    rec = Reconciler(Lists(), ledger, CFG, nodes, pods, keep_ms=0)  # type: ignore[arg-type]
    out, _ = await ledger.reserve("rb", "gone", [0], 96, 4, 1, pod="ns/deleted-meanwhile")
    assert out.ok and await ledger.mark_bound("rb", "gone")
    await asyncio.sleep(0.2)  # older than the rebuild's keep window
    nudged: list[str] = []
    pods.nudger.nudge = nudged.append  # type: ignore[method-assign]
    await rec.rebuild("test")
    snap = await ledger.snapshot("rb")
    assert snap is not None and "gone" not in snap.reservations  # the card is free again
    assert nudged == ["rb"], f"nudged {nudged}: the pods kube-scheduler parked on rb wait for its flush"
