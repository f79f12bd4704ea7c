"""Red team (a node's cards changing under bound pods): a card the device plugin reports unhealthy.

A device plugin says a device is sick the one way Kubernetes has: the kubelet counts only healthy devices in
the Node's `status.allocatable` (capacity keeps them all; a plugin that stops or restarts has every device
unhealthy until it registers again). The vendor's plugin writes no per-card annotation, so the sick devices'
card cannot be told. Before, node_inventory read `capacity` alone: a card whose devices went unhealthy was
still offered, every card `ok`, and the extender booked the sick card (kube-scheduler's NodeResourcesFit counts
the node's totals against allocatable, never which card), while `mtsched explain` tells the user to wait for
"the device plugin reports it healthy again", which nothing read. Such a node must offer no card and say why
(the scheduler never guesses which card has what), keep what running pods hold, and offer its cards again,
usage kept, once every device is healthy again.

Real parts: redis-server, the product's Ledger and NodeWatcher; the API is the watcher's own events."""

from __future__ import annotations

from typing import Any

import pytest

from controller.node_watch import NodeWatcher
from shared.config import load_config
from shared.domain.annotations import PodUsage
from shared.domain.fit import CardState, fit
from shared.domain.node import mismatch_kind, node_inventory
from shared.domain.request import pod_request
from shared.store.ledger import Ledger

pytestmark = pytest.mark.redis
CFG = load_config(env={}, flags={"memoryPerCard": "96,160"})
CORE, MEM = "mthreads.com/sgpu-core", "mthreads.com/sgpu-memory"


class NoKube:
    """The watchers' API client: none of these tests expects a call."""

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        raise AssertionError(f"unexpected {method} {path}")


def gpu_node(name: str, cards: int = 8, sick_cards: int = 0, units: int = 96) -> dict[str, Any]:
    cap = {CORE: str(16 * cards), MEM: str(units * cards)}
    alloc = {CORE: str(16 * (cards - sick_cards)), MEM: str(units * (cards - sick_cards))}
    return {"metadata": {"name": name}, "status": {"capacity": cap, "allocatable": alloc}}


def whole_card_pod() -> dict[str, Any]:
    limits = {"mthreads.com/vgpu": "1", CORE: "16", MEM: "96"}
    return {"metadata": {"name": "p", "namespace": "ns", "annotations": {}},
            "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}


@pytest.mark.parametrize("sick", [1, 8])
def test_a_node_with_unhealthy_devices_offers_no_card(sick: int) -> None:
    inv = node_inventory(gpu_node("n", sick_cards=sick), CFG)
    req = pod_request(whole_card_pod(), CFG)
    assert req is not None
    assert not fit([CardState(c) for c in inv.cards], req, {}, "spread").ok  # no card of it is booked
    assert inv.cards == () and "unhealthy" in inv.error
    assert mismatch_kind(inv.error) == inv.problem == ""  # not a configuration mismatch: no NodeCardMismatch


@pytest.mark.parametrize("alloc", [None, {}, {"cpu": "64"}])
def test_a_node_without_an_allocatable_count_is_read_from_capacity(alloc: dict[str, str] | None) -> None:
    """Objects written by hand or by tools without allocatable (or without our keys in it) keep their cards."""
    n = gpu_node("n", cards=2)
    if alloc is None:
        del n["status"]["allocatable"]
    else:
        n["status"]["allocatable"] = alloc
    assert len(node_inventory(n, CFG).cards) == 2


async def test_unhealthy_then_healthy_keeps_what_running_pods_hold(ledger: Ledger) -> None:
    w = NodeWatcher(NoKube(), ledger, CFG)  # type: ignore[arg-type]
    held = {"u5": (PodUsage("h", (5,), 96, 16, 1), "ns/p5")}
    w.holders = lambda node: dict(held) if node == "h" else {}
    nudged: list[str] = []
    w.nudge = nudged.append
    await w.on_event("ADDED", gpu_node("h"))
    assert nudged == ["h"]  # a new node's room (offers_more)
    nudged.clear()
    assert await ledger.observe("u5", held["u5"][0], "ns/p5")
    await w.on_event("MODIFIED", gpu_node("h", sick_cards=1))
    snap = (await ledger.snapshots(["h"]))["h"]
    assert "unhealthy" in snap.error and snap.card_states() == []  # nothing offered, the reason in the ledger
    assert snap.cards[5].mem_used == 96 and "u5" in snap.reservations  # what the running pod holds is kept
    await w.on_event("MODIFIED", gpu_node("h"))
    snap = (await ledger.snapshots(["h"]))["h"]
    assert snap.error == "" and len(snap.card_states()) == 8
    assert (snap.cards[5].mem_used, snap.cards[5].mem_free, snap.cards[5].health) == (96, 0, "ok")
    assert nudged == ["h"]  # pods turned away meanwhile are tried again


def test_a_mismatch_is_said_before_unhealthy_devices() -> None:
    """A node both mismatched and short of healthy devices: the mismatch, which needs the operator, is reported."""
    n = gpu_node("n", cards=2, sick_cards=1)
    n["metadata"]["labels"] = {"mthreads.com/sgpu.cores": "0-1-2"}
    assert node_inventory(n, CFG).problem == "label"


@pytest.mark.parametrize(("sick", "cordon", "offered"), [
    (1, [], 0),  # which card is sick nothing says: none offered
    (1, [3], 7),  # the operator cordoned one card: the shortfall is covered, the other seven are offered
    (2, [3], 0),  # two cards' devices missing, one cordoned: not covered
    (2, [3, 6], 6),
    (0, [3], 7),  # cordoned while healthy: as before
    (1, [3, 99], 7),  # a cordoned id that is no card of the node covers nothing (the other one does)
    (2, [3, 99], 0),
])
def test_cordoning_cards_that_cover_the_unhealthy_devices_offers_the_others(
        sick: int, cordon: list[int], offered: int) -> None:
    n = gpu_node("n", sick_cards=sick)
    n["metadata"]["annotations"] = {"hami.io/device-cordon": ",".join(f"n-mthreads-{i}" for i in cordon)}
    inv = node_inventory(n, CFG)
    assert sum(c.health == "ok" for c in inv.cards) == offered, inv.error
    if offered == 0:
        assert "unhealthy" in inv.error and "hami.io/device-cordon" in inv.error
    else:
        assert inv.error == "" and {c.index for c in inv.cards if c.cordoned} == {i for i in cordon if i < 8}


@pytest.mark.parametrize(("cordon", "said"), [
    ("2", "entries naming no card of this node: 2 (its cards are named like n-mthreads-0)"),
    ("other-mthreads-1, n-mthreads-9", "naming no card of this node: n-mthreads-9, other-mthreads-1"),
    ("n-mthreads-1", ""),  # a card of the node, yet not covering two sick ones: no hint
])
def test_a_cordon_naming_no_card_is_said_where_the_node_stays_closed(cordon: str, said: str) -> None:
    """An operator who cordons the sick card by its bare index (or a typo) cordons nothing: the node stays
    closed, and its reason now says which entries named no card (docs: red team, truthfulness)."""
    n = gpu_node("n", sick_cards=2)
    n["metadata"]["annotations"] = {"hami.io/device-cordon": cordon}
    inv = node_inventory(n, CFG)
    assert inv.cards == () and "unhealthy" in inv.error
    if said:
        assert said in inv.error, inv.error
    else:
        assert "naming no card" not in inv.error
