"""Red team (a node's cards changing under bound pods): a running pod whose allocation record is gone (its
`mthreads.com/gpu-index` survives, so the watchers recover its usage from it and book it) on a node that offers
no card for a while (an error: a device unhealthy, a label or model mismatch).

The pod view's holders of a closed node cannot include such a pod (its usage is read against the node's cards,
and a closed node has none), which is harmless while the node stays as the ledger holds it: an upsert keeps every
booking. But a watcher that starts (a rollout, a crash) while the node is closed writes it whole from that view,
dropping the pod's booking; before, when the node then opened again, the same watcher only upserted it, and the
card was offered free under the running pod until the reconciler's next pass (reconcileSeconds, 30 s by default)
found the holder missing: any burst meanwhile could book the card over it. The same without any restart when
the node stops reporting cards for a while (deleted and created again under its running pods; its device
plugin's resources at 0, as a kubelet restart shows them until the plugin registers again) while a pod with a
record holds a card there too: the node was kept on placeholder cards with the view's holders, without the
recovered pod, and upserted when it came back. A node that opens again is now written whole with its holders,
as a node new to the watcher is."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis

from controller.node_watch import NodeWatcher
from controller.pod_watch import PodWatcher
from controller.watchers import wire
from shared.config import load_config
from shared.domain.annotations import GPU_INDEX, CardGrant, binding_annotations, device_id
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis.test_redteam_inflight_nodes import age

pytestmark = pytest.mark.redis
CFG = load_config(env={}, flags={"memoryPerCard": "96,160"})
CORE, MEM, VGPU = "mthreads.com/sgpu-core", "mthreads.com/sgpu-memory", "mthreads.com/vgpu"


class NoKube:
    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        raise AssertionError(f"unexpected {method} {path}")


def gpu_node(name: str, closed: str = "") -> dict[str, Any]:
    """Two S4000 cards; `closed`: why it offers none ("sick": a device unhealthy, "label": a label mismatch)."""
    cap = {CORE: "32", MEM: "192"}
    alloc = {CORE: "16", MEM: "96"} if closed == "sick" else cap
    labels = {"mthreads.com/sgpu.cores": "0-1-2"} if closed == "label" else {}
    return {"metadata": {"name": name, "labels": labels}, "status": {"capacity": cap, "allocatable": alloc}}


def recorded_pod(node: str) -> dict[str, Any]:
    """A pod our bind placed on card 0 (8 units, 2 cores), its record intact."""
    ann = binding_annotations(node, [[CardGrant(device_id(node, 0), 8 * 512, 2)]], 0)
    return {"metadata": {"name": "a", "namespace": "ns", "uid": "u-a", "annotations": ann},
            "spec": {"nodeName": node, "schedulerName": CFG.scheduler_name,
                     "containers": [{"name": "c", "resources": {"limits": {VGPU: "1", MEM: "8", CORE: "2"}}}]},
            "status": {"phase": "Running"}}


def unrecorded_pod(node: str) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u-p", "annotations": {GPU_INDEX: "1"}},
            "spec": {"nodeName": node, "schedulerName": CFG.scheduler_name,
                     "containers": [{"name": "c", "resources": {"limits": {VGPU: "1", MEM: "64", CORE: "8"}}}]},
            "status": {"phase": "Running"}}


async def roles(ledger: Ledger) -> tuple[NodeWatcher, PodWatcher]:
    nodes = NodeWatcher(NoKube(), ledger, CFG, keep_ms=10_000)  # type: ignore[arg-type]
    pods = PodWatcher(NoKube(), ledger, Mirror(ledger), CFG, nodes.lost)  # type: ignore[arg-type]
    wire(nodes, pods)
    pods.reflector.synced.set()
    return nodes, pods


async def held_with_recovered(ledger: Ledger, redis_client: Redis) -> tuple[NodeWatcher, PodWatcher]:
    """Node q with a recorded pod (card 0) and a recovered one (card 1), both booked a minute ago."""
    nodes, pods = await roles(ledger)
    await pods.on_sync([recorded_pod("q"), unrecorded_pod("q")])
    await nodes.on_sync([gpu_node("q")])
    snap = (await ledger.snapshots(["q"]))["q"]
    assert (snap.cards[0].mem_used, snap.cards[1].mem_used) == (8, 64)
    for uid in ("u-a", "u-p"):
        await age(redis_client, ledger, "q", uid, 60_000)
    return nodes, pods


@pytest.mark.parametrize("closed", ["label", "sick"])
async def test_a_recovered_holder_survives_a_watcher_start_while_its_node_is_closed(ledger: Ledger, redis_client: Redis,
                                                                                   closed: str) -> None:
    nodes, pods = await roles(ledger)
    await pods.on_sync([unrecorded_pod("q")])
    await nodes.on_sync([gpu_node("q")])
    snap = (await ledger.snapshots(["q"]))["q"]
    assert snap.cards[1].mem_used == 64 and "u-p" in snap.reservations  # recovered from gpu-index, booked
    await age(redis_client, ledger, "q", "u-p", 60_000)
    await nodes.on_event("MODIFIED", gpu_node("q", closed))  # closed: what the pod holds is kept
    assert (await ledger.snapshots(["q"]))["q"].cards[1].mem_used == 64
    # a new watcher process (the old one's view gone) while the node is still closed
    nodes, pods = await roles(ledger)
    await pods.on_sync([unrecorded_pod("q")])
    await nodes.on_sync([gpu_node("q", closed)])
    await nodes.on_event("MODIFIED", gpu_node("q"))  # open again
    snap = (await ledger.snapshots(["q"]))["q"]
    assert snap.error == "" and snap.cards[1].mem_used == 64, snap


def no_cards(name: str) -> dict[str, Any]:
    """The node as the kubelet shows it for a moment after a restart: its device plugin's resources at 0."""
    return {"metadata": {"name": name}, "status": {"capacity": {CORE: "0", MEM: "0"}, "allocatable": {}}}


@pytest.mark.parametrize("gone", ["capacity-0", "deleted"])
async def test_a_recovered_holder_survives_its_node_reporting_no_card_for_a_while(ledger: Ledger, redis_client: Redis,
                                                                                  gone: str) -> None:
    """The node stops reporting cards (a kubelet restart zeroes the device plugin's resources until it registers
    again; or the Node is deleted and created again) while a pod with a record and a recovered one hold cards:
    the node is kept on placeholder cards with the holders the view has, which lack the recovered pod (its usage
    is read against the node's cards). When the node reports its cards again, the recovered pod's card must not
    be offered free."""
    nodes, _ = await held_with_recovered(ledger, redis_client)
    if gone == "deleted":
        await nodes.on_event("DELETED", gpu_node("q"))
        await nodes.on_event("ADDED", gpu_node("q"))
    else:
        await nodes.on_event("MODIFIED", no_cards("q"))
        await nodes.on_event("MODIFIED", gpu_node("q"))
    snap = (await ledger.snapshots(["q"]))["q"]
    assert snap.error == "" and (snap.cards[0].mem_used, snap.cards[1].mem_used) == (8, 64), snap
