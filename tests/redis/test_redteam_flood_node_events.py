"""Red team (unlucky load): each Node event read every pod of the cluster, and a re-list of Nodes read them all once
per node.

The node watcher asks the pod watcher which pods hold cards on a node (`holders`) for every event of a node that
reports no card (a CPU node: most nodes of a mixed cluster) and for each node a re-list writes, and the answer was
made by a pass over every live pod of the view: a re-list of the Nodes cost O(nodes x pods) on the watcher's event
loop (2,000 CPU nodes and 50,000 bound pods held it 6.6 s here; every task of the role, the feed, /readyz and
/metrics waited) and every status update of any CPU node O(pods). Now the pods are indexed by the nodes they name,
so a node's holders are read from its own pods.

Real parts: redis-server, the product's Ledger, NodeWatcher and PodWatcher.
"""

from __future__ import annotations

import asyncio
from collections.abc import ItemsView, Iterator
from typing import Any

import pytest

from controller.node_watch import NodeWatcher
from controller.pod_watch import PodTruth, PodWatcher
from shared.domain.annotations import PodUsage
from shared.store.ledger import Ledger
from tests.redis.test_redteam_node_health import CFG, NoKube, gpu_node

pytestmark = pytest.mark.redis


class Counted(dict[str, PodTruth]):
    """The pod view, counting the entries a pass over it reads."""

    read = 0

    def items(self) -> ItemsView[str, PodTruth]:
        counted = self

        class View(ItemsView[str, PodTruth]):
            def __iter__(self) -> Iterator[tuple[str, PodTruth]]:
                for kv in dict.items(counted):
                    counted.read += 1
                    yield kv

        return View(self)


def cpu_node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"capacity": {"cpu": "64"}}}


async def test_a_relist_of_nodes_reads_each_pod_a_bounded_number_of_times(ledger: Ledger) -> None:
    pods = PodWatcher(NoKube(), ledger, None, CFG, asyncio.Event())  # type: ignore[arg-type]
    nodes = NodeWatcher(NoKube(), ledger, CFG)  # type: ignore[arg-type]
    nodes.holders = pods.holders
    for i in range(2000):  # bound pods holding one slice each, on 20 GPU nodes
        node = f"g{i % 20}"
        pods.truth[f"u{i}"] = PodTruth(f"ns/p{i}", node, PodUsage(node, (i % 8,), 2, 1, 1))
    view = Counted(pods.truth)
    pods.truth = view
    if hasattr(pods, "_by_node"):
        pods._by_node = None  # (the view was set by hand: indexed again from it)
    listed = [gpu_node(f"g{i}") for i in range(20)] + [cpu_node(f"cpu{i}") for i in range(200)]
    await nodes.on_sync(listed)
    assert view.read <= 2 * len(view), f"{view.read} reads of {len(view)} pods for {len(listed)} nodes"
    snap = await ledger.snapshot("g3")  # written new, with its 100 holders
    assert snap is not None and len(snap.reservations) == 100
    view.read = 0
    for i in range(50):
        await nodes.on_event("MODIFIED", cpu_node(f"cpu{i}"))  # status updates of CPU nodes
    assert view.read == 0, view.read
