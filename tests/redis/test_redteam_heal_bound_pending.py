"""Red team: the runbook's heal bound does not hold for the bookings a killed extender leaves.

docs/runbooks.md, "Faults": "The bound for the ledger to equal the API's truth after a fault has ended is
**reconcileSeconds + 10 s (the keep window) + one pass**, i.e. about 45 s with the default reconcileSeconds: 30",
and the row "an extender SIGKILLed" gives heal 0.0 s. The same row says the in-flight binds' pending bookings
are released "by the extender's retry or the janitor after pendingTTLSeconds" (default 120 s, swept every 5 s,
and not at all while the pod view has been back for under 10 s). The reconciler never judges a pending
booking (`shared/domain/reconcile.py` `settles`: `r.state == "pending"` settles forever), whatever the API says.

Unlucky sequence: the extender booked card 0 of node a for pod p and was SIGKILLed before the Binding;
kube-scheduler retried p, another replica bound it on node b (record written). The API's truth is now exact:
p holds a card of b, none of a. Yet 60 s later (past the documented 45 s), and after a full reconcile pass,
the ledger still books a's card for p: a card held for a pod running elsewhere until pendingTTLSeconds (up
to ~125 s with the defaults, longer with a raised TTL: the runbook itself advises raising it for slow API
servers). Fail closed (no over-commit), but the documented bound is wrong for this fault, and a full card
refuses pods meanwhile.

Expected: a pending booking of a pod the API shows bound on another node is stale beyond doubt (a pod binds
once) and is dropped by the next pass, or the runbook's bound says max(reconcileSeconds + 10 s + pass,
pendingTTLSeconds + 5 s + 10 s). Fix: shared/domain/reconcile.py `diff_node`/controller/reconciler.py (judge a
pending booking whose uid holds cards on another node per the pod view), or docs/runbooks.md.

Real parts: redis-server, Ledger, Mirror, NodeWatcher, PodWatcher, Reconciler.
"""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis

from shared.serving.metrics import RECONCILE_LAST
from shared.store.ledger import Ledger
from tests.redis.test_redteam_inflight_nodes import age, bound_pod, gpu_node
from tests.redis.test_redteam_rebuild_race import Api, age_fence, role

pytestmark = pytest.mark.redis


class ApiWithPods(Api):
    def __init__(self, nodes: list[dict[str, Any]], pods: list[dict[str, Any]]):
        super().__init__(nodes)
        self.pods = pods

    async def request(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        if method == "GET" and path == "/api/v1/pods":
            return {"items": [dict(p) for p in self.pods], "metadata": {"resourceVersion": "7"}}
        return await super().request(method, path, body, **kw)

    async def get_pod(self, ns: str, name: str) -> Any:
        for p in self.pods:
            if p["metadata"]["namespace"] == ns and p["metadata"]["name"] == name:
                return p
        from shared.kube import KubeError
        raise KubeError(404, {"message": "not found"}, "get pod")


async def test_redteam_op_a_dead_binders_booking_heals_within_the_documented_bound(ledger: Ledger,
                                                                                   redis_client: Redis) -> None:
    pod = bound_pod("p", "b", 0, 64 * 512, 12)  # 64 units (MiB in the record); where kube-scheduler's retry bound it
    api = ApiWithPods([gpu_node("a"), gpu_node("b")], [pod])
    nodes, pods, rec = await role(ledger, api)
    nodes.reflector.synced.set()
    pods.reflector.synced.set()
    RECONCILE_LAST.set(0)
    await rec.rebuild("start")
    # a rebuild is a comparison with the API: MtschedLedgerNotReconciled does not wait for the first pass
    assert RECONCILE_LAST._value.get() > 0  # type: ignore[attr-defined]
    b = await ledger.snapshot("b")
    assert b is not None and "p" in b.reservations, "the rebuild booked p where the API shows it (node b)"
    # a start on an empty Redis while pods of ours exist: the nodes wait the keep window (a bind may have been
    # in flight when Redis lost them, docs/redis-layout.md "Losing Redis"); let it pass
    for node in ("a", "b"):
        await age_fence(redis_client, ledger, node, rec.keep_ms)
    await rec.reconcile_all()
    # the killed extender's first attempt: booked on a, never bound; 60 s ago (past the runbook's 45 s bound)
    out = await ledger.reserve("a", "p", [0], 64, 12, 1, pod="ns/p")
    assert out[0].ok, out
    await age(redis_client, ledger, "a", "p", 60_000)
    await rec.reconcile_all()
    snap = await ledger.snapshot("a")
    assert snap is not None
    assert "p" not in snap.reservations, (
        f"60 s after the fault (documented bound ~45 s) and after a full reconcile pass, node a still books card 0 "
        f"for pod ns/p, which the API shows bound on node b: {snap.reservations['p']}; "
        f"card 0 of a: mem_used {snap.cards[0].mem_used}/{snap.cards[0].capacity} (freed only at pendingTTLSeconds)")
