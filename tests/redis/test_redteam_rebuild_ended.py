"""Red team: a pod deleted while a rebuild lists the pods is booked by the rebuild and must be given back at once.

The rebuild (`Reconciler.rebuild`) books every bound pod its Pod list holds. A pod deleted after that list was
taken has been released already by the pod watcher (its DELETED event), and the rebuild books it again; the
rebuild then gives back the pods the watch saw end (`PodWatcher.ended`). It looked for their nodes in the
watcher's mirror only, which has not read the rebuild yet (it re-reads each node after the rebuild's message) and
shows the pod released: the booking stayed, the cards held for nobody, until a reconcile pass dropped it
(reconcileSeconds plus the keep window later).

Real parts: redis-server, the product's Ledger, Mirror (not running: its view is the one before the rebuild),
NodeWatcher, PodWatcher and Reconciler; the API client answers the lists, and the pod's DELETED event is handled
while the Pod list is in flight."""

from __future__ import annotations

import pytest

from shared.store.ledger import Ledger
from tests.redis.test_redteam_inflight_nodes import bound_pod, gpu_node
from tests.redis.test_redteam_rebuild_race import Api, role

pytestmark = pytest.mark.redis


class ListsPod(Api):
    """The Pod list holds `pod` (taken before its deletion)."""

    def __init__(self, nodes: list[dict[str, object]], pod: dict[str, object]):
        super().__init__(nodes)  # type: ignore[arg-type]
        self.pod = pod

    async def request(self, method: str, path: str, body: object = None, **kw: object) -> object:
        out = await super().request(method, path, body, **kw)
        if method == "GET" and path != "/api/v1/nodes":
            return {"items": [self.pod], "metadata": {"resourceVersion": "7"}}
        return out


async def test_a_pod_deleted_during_the_rebuilds_list_is_given_back_where_the_rebuild_booked_it(
        ledger: Ledger) -> None:
    pod = bound_pod("gone", "n", 0, 64 * 512, 12)
    api = ListsPod([gpu_node("n")], pod)
    nodes, pods, rec = await role(ledger, api)
    nodes.reflector.synced.set()
    pods.reflector.synced.set()
    await rec.rebuild("start")  # the node is written; the pod booked
    assert "gone" in (await ledger.snapshots(["n"]))["n"].reservations

    async def deleted() -> None:  # the watch's DELETED event, while the next rebuild's Pod list is in flight
        await pods.on_event("DELETED", pod)
        assert "gone" not in (await ledger.snapshots(["n"]))["n"].reservations

    api.during_pods = deleted
    await rec.rebuild("state lost")
    snap = (await ledger.snapshots(["n"]))["n"]
    assert "gone" not in snap.reservations, f"the deleted pod's booking is left: {snap.reservations.get('gone')}"
