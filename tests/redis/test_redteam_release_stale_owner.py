"""Red team (the janitor stress's mirrors): a deleted pod's release is sent to the node a stale mirror names.

The pod watcher releases a deleted pod on `Mirror.owner_of(uid, hint=nodeName)`: the pod's node if the mirror shows
the booking there, else any node whose snapshot lists the uid, else nodeName. A mirror whose feed connection was lost
(Pub/Sub: what it misses is gone until its re-read) may still list an earlier bind attempt's booking on another node,
given back since, and not yet the booking the pod is bound with. The release then goes to that other node ("gone"),
and the bound booking on the pod's own node stays: its cards are held for nobody until the reconciler's next pass
drops it (reconcileSeconds plus the keep window later). Nothing else retries the release. Fixed: a bound pod is
released on its nodeName, and on the node the mirror lists too (`PodWatcher.release`).

Real parts: redis-server, the Ledger and its scripts, the Mirror (its state read at one instant: its feed is down),
the PodWatcher's DELETED handling."""

from __future__ import annotations

import asyncio

import pytest

from controller.pod_watch import PodWatcher
from shared.domain.annotations import CardGrant, binding_annotations, device_id
from shared.domain.models import UNIT_MIB
from shared.kube import Kube
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis.conftest import WATCHER_CFG
from tests.redis.helpers import S4000, inventory

pytestmark = pytest.mark.redis
HOLD = 5000


def deleted_pod(uid: str, node: str) -> dict[str, object]:
    """The pod as its DELETED event carries it: bound to `node` with 2 units and 1 core on card 0."""
    ann = binding_annotations(node, [[CardGrant(device_id(node, 0), 2 * UNIT_MIB, 1)]], 0)
    limits = {"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "2", "mthreads.com/sgpu-core": "1"}
    return {"metadata": {"name": uid, "namespace": "ns", "uid": uid, "annotations": ann},
            "spec": {"schedulerName": WATCHER_CFG.scheduler_name, "nodeName": node,
                     "containers": [{"name": "c", "resources": {"limits": limits}}]},
            "status": {"phase": "Running"}}


async def test_a_deleted_pod_is_released_on_its_own_node_whatever_a_stale_mirror_lists(ledger: Ledger) -> None:
    for node in ("a", "b"):
        await ledger.upsert_node(inventory(node, S4000, n=1))
    mirror = Mirror(ledger)  # the watcher role's mirror
    a, _ = await ledger.reserve("a", "p", [0], 2, 1, 1, pod="ns/p", hold_ms=HOLD)  # attempt A, on node a
    assert a.ok
    await mirror.resync(full=True)  # the mirror has A's booking; then its feed connection is lost
    # A's Binding is refused: given back. kube-scheduler's retry B books on node b; its Binding is committed and
    # confirmed. (The mirror hears none of it: its feed is down, its re-read not done yet.)
    assert (await ledger.give_back("a", "p", a.bind_no, attempt=a.attempt))[0] == "released"
    b, _ = await ledger.reserve("b", "p", [0], 2, 1, 1, pod="ns/p", hold_ms=HOLD)
    assert b.ok and await ledger.mark_bound("b", "p")
    assert "p" in mirror.nodes["a"].reservations and "p" not in mirror.nodes["b"].reservations
    watcher = PodWatcher(Kube(None), Ledger(ledger.redis), mirror, WATCHER_CFG, asyncio.Event())  # type: ignore[arg-type]
    watcher.nudger.nudge = lambda node: None  # type: ignore[method-assign]
    await watcher.on_event("DELETED", deleted_pod("p", "b"))  # the pod is deleted
    snap = await ledger.snapshot("b")
    assert snap is not None
    assert "p" not in snap.reservations, f"the deleted pod's booking on its node is left: {snap.reservations['p']}"
