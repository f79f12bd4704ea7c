"""Red team, configuration changes on a live cluster: `helm upgrade` raising `maxSlicesPerCard`, or adding a card model
to `memoryPerCard`, lets pods in that kube-scheduler parked (CardTimeSlicingExhausted, `node unregistered: ... no
configured card model`) only once the new watchers have written the ledger anew: their start-up rebuild. Nothing
nudged kube-scheduler then (a fresh watcher has no baseline to see a rise against, and the rebuild nudged only
nodes where it freed bookings), so a pod parked before the rebuild, against the ledger the old watchers wrote,
waited for an unrelated event or kube-scheduler's 5-minute flush, where the docs say any rise of a card's slice
limit, and a node that offered no card before, nudges it (docs/rules.md, Card knobs).

Real parts: redis-server, the product's Ledger, NodeWatcher, PodWatcher and Reconciler, each under the Config of
its release; the API client answers the two lists (the nodes, no pod)."""

from __future__ import annotations

from typing import Any

import pytest

from controller.node_watch import NodeWatcher
from controller.pod_watch import PodWatcher
from controller.reconciler import Reconciler
from controller.watchers import wire
from shared.config import Config, load_config
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis.test_redteam_inflight_nodes import gpu_node

pytestmark = pytest.mark.redis


class Lists:
    def __init__(self, *nodes: dict[str, Any]) -> None:
        self.nodes = list(nodes)

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        assert method == "GET", (method, path)
        items = self.nodes if path == "/api/v1/nodes" else []
        return {"items": items, "metadata": {"resourceVersion": "7"}}


def cfg(**flags: str) -> Config:
    return load_config(env={}, flags={"reconcileSeconds": "300", **flags})


async def old_release(ledger: Ledger, config: Config, *nodes: dict[str, Any]) -> None:
    """The ledger as the old release's watchers wrote it."""
    w = NodeWatcher(Lists(*nodes), ledger, config)  # type: ignore[arg-type]
    for n in nodes:
        await w.on_event("ADDED", n)


async def new_release_starts(ledger: Ledger, config: Config, *nodes: dict[str, Any]) -> list[str]:
    """A watcher of the new release starting (its rebuild, then the node stream's first list): the nodes it nudged."""
    kube = Lists(*nodes)
    w = NodeWatcher(kube, ledger, config)  # type: ignore[arg-type]
    pods = PodWatcher(kube, ledger, Mirror(ledger), config, w.lost)  # type: ignore[arg-type]
    wire(w, pods)
    nudged: list[str] = []
    pods.nudger.nudge = nudged.append  # type: ignore[method-assign]
    w.nudge = nudged.append
    rec = Reconciler(kube, ledger, config, w, pods, keep_ms=0)  # type: ignore[arg-type]
    await rec.rebuild("start")
    await w.on_sync(list(nodes))
    return sorted(set(nudged))


async def test_redteam_cfg_raising_max_slices_nudges_the_nodes_it_opens_up(ledger: Ledger) -> None:
    await old_release(ledger, cfg(maxSlicesPerCard="4"), gpu_node("up"))
    snap = await ledger.snapshot("up")
    assert snap is not None and {c.slice_limit for c in snap.cards.values()} == {4}
    nudged = await new_release_starts(ledger, cfg(maxSlicesPerCard="16"), gpu_node("up"))
    snap = await ledger.snapshot("up")
    assert snap is not None and {c.slice_limit for c in snap.cards.values()} == {16}
    assert nudged == ["up"], (f"nudged {nudged}: pods parked for CardTimeSlicingExhausted on 'up' wait for "
                              "kube-scheduler's flush")


async def test_redteam_cfg_adding_a_card_model_nudges_the_nodes_it_opens(ledger: Ledger) -> None:
    await old_release(ledger, cfg(memoryPerCard="96"), gpu_node("s5", 160), gpu_node("s4", 96))
    snap = await ledger.snapshot("s5")
    assert snap is not None and "no configured card model" in snap.error
    nudged = await new_release_starts(ledger, cfg(memoryPerCard="96,160"), gpu_node("s5", 160), gpu_node("s4", 96))
    snap = await ledger.snapshot("s5")
    assert snap is not None and not snap.error and len(snap.cards) == 2
    assert nudged == ["s5"], f"nudged {nudged}: pods parked as 'node unregistered' on s5 wait for the flush"


async def test_redteam_cfg_an_unchanged_or_lowered_configuration_nudges_nothing(ledger: Ledger) -> None:
    await old_release(ledger, cfg(maxSlicesPerCard="8"), gpu_node("same"), gpu_node("down"))
    assert await new_release_starts(ledger, cfg(maxSlicesPerCard="8"), gpu_node("same"), gpu_node("down")) == []
    assert await new_release_starts(ledger, cfg(maxSlicesPerCard="2"), gpu_node("same"), gpu_node("down")) == []
