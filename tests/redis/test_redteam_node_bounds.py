"""Red team (a node's cards changing under bound pods): a node whose reported cards lie outside what the ledger
holds (more than 1024 cards, a card id above 1023 in the `mthreads.com/sgpu.cores` label, a capacity in the
quadrillions from a buggy device plugin).

Before: node_inventory turned them into cards (1,000,000 Card objects in 3.5 s of the event loop, a MemoryError
for 10**16), the ledger's scripts refused the write (BADINPUT: at most 1024 cards, ids 0..1023) and the node
watcher's handler raised. The re-list then raised on that node in every attempt, so no node listed after it was
ever written, removed or re-read: one bad Node wedged the node watcher for the whole cluster. Such a node must
offer no card, with its reason, like any other node whose numbers the scheduler cannot use (fail closed).

Real parts: redis-server, the product's Ledger and NodeWatcher; the API is the watcher's own list and events."""

from __future__ import annotations

from typing import Any

import pytest

from controller.node_watch import NodeWatcher
from shared.config import load_config
from shared.domain.node import CAPACITY_MISMATCH, LABEL_MISMATCH, mismatch_kind, node_inventory
from shared.store.ledger import Ledger

pytestmark = pytest.mark.redis
CFG = load_config(env={}, flags={"memoryPerCard": "96,160"})


class NoKube:
    """The watchers' API client: none of these tests expects a call."""

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        raise AssertionError(f"unexpected {method} {path}")


def gpu_node(name: str, cards: int, units: int = 96, label: str | None = None) -> dict[str, Any]:
    cap = {"mthreads.com/sgpu-core": str(16 * cards), "mthreads.com/sgpu-memory": str(units * cards)}
    meta: dict[str, Any] = {"name": name}
    if label is not None:
        meta["labels"] = {"mthreads.com/sgpu.cores": label}
    return {"metadata": meta, "status": {"capacity": cap, "allocatable": cap}}


BAD = [
    pytest.param(gpu_node("a-many", 2000), CAPACITY_MISMATCH, id="2000-cards"),
    pytest.param(gpu_node("a-huge", 10**16), CAPACITY_MISMATCH, id="1e16-cards"),
    pytest.param(gpu_node("a-id", 3, label="0-1-5000"), LABEL_MISMATCH, id="card-id-5000"),
]


@pytest.mark.parametrize(("node", "kind"), BAD)
def test_a_node_beyond_the_ledgers_bounds_offers_no_card_and_says_why(node: dict[str, Any], kind: str) -> None:
    inv = node_inventory(node, CFG)  # (10**16 cards: no list of them is built, which was a MemoryError)
    assert inv.cards == () and inv.error and inv.problem == kind == mismatch_kind(inv.error)


async def test_the_largest_node_the_ledger_holds_is_still_served(ledger: Ledger) -> None:
    w = NodeWatcher(NoKube(), ledger, CFG)  # type: ignore[arg-type]
    await w.on_sync([gpu_node("big", 1024), gpu_node("ids", 2, label="0-1023")])
    snaps = await ledger.snapshots(["big", "ids"])
    assert len(snaps["big"].cards) == 1024 and snaps["big"].error == ""
    assert sorted(snaps["ids"].cards) == [0, 1023]


@pytest.mark.parametrize(("node", "kind"), BAD)
async def test_one_bad_node_does_not_wedge_the_node_watcher(ledger: Ledger, node: dict[str, Any], kind: str) -> None:
    """The re-list writes every node, the bad one closed with its reason; its events are handled too."""
    w = NodeWatcher(NoKube(), ledger, CFG)  # type: ignore[arg-type]
    name = node["metadata"]["name"]
    await w.on_sync([node, gpu_node("b-good", 2)])  # the bad node sorts first, as it may in a list
    snaps = await ledger.snapshots([name, "b-good"])
    assert len(snaps["b-good"].cards) == 2
    assert snaps[name].cards == {} and mismatch_kind(snaps[name].error) == kind
    await w.on_event("MODIFIED", node)
    await w.on_event("ADDED", gpu_node("c-later", 1))
    assert len((await ledger.snapshots(["c-later"]))["c-later"].cards) == 1
