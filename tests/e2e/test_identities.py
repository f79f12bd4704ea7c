"""The roles run as the chart deploys them: each with its ServiceAccount and the chart's RBAC.

deploy/local/stack.py gives every role (kube-scheduler too) the kubeconfig of the ServiceAccount
its chart Deployment uses, with the RBAC of the rendered manifest (deploy/local/identities.py).
Here: who each kubeconfig is (SelfSubjectReview), that each identity may make the calls its role
makes and nothing else we check (SelfSubjectAccessReview, and real calls refused with 403), and
that the watcher's calls beyond its watches go through under its identity in the running process:
the nudge (a node patch) and the reconciler's confirmation (a GET of a pod).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio
import yaml
from redis.asyncio import Redis

from controller.nudger import FREED_ANNOTATION
from deploy.local import nodes as simulated
from deploy.local.controlplane import ControlPlane
from deploy.local.redis import RedisServer
from deploy.local.stack import Stack
from shared.domain.access import needs_of
from shared.domain.nudge import any_node_wakes
from shared.kube import Kube, KubeError
from shared.serving.access import AccessProbe
from shared.store.ledger import Ledger
from tests.e2e._wait import until

pytestmark = pytest.mark.e2e

LABEL = "mtsched.io/e2e-identities"
ROLES = ("kube-scheduler", "extender", "webhook", "watcher")

# (role, verb, resource[/subresource], namespace) -> allowed. Every call a role makes (controller/,
# webhook/, shared/) is listed as allowed; the rest are writes or reads it must not be able to make.
ACCESS: list[tuple[str, str, str, str, bool]] = [
    # watcher: Reflector list+watch of /api/v1/nodes and /api/v1/pods, Reconciler gets a pod by name,
    # Nudger merge-patches a node
    ("watcher", "list", "nodes", "", True),
    ("watcher", "watch", "nodes", "", True),
    ("watcher", "list", "pods", "", True),
    ("watcher", "watch", "pods", "", True),
    ("watcher", "get", "pods", "default", True),
    ("watcher", "patch", "nodes", "", True),
    ("watcher", "delete", "nodes", "", False),
    ("watcher", "get", "nodes", "", False),
    ("watcher", "update", "nodes", "", False),
    ("watcher", "patch", "nodes/status", "", False),
    ("watcher", "get", "secrets", "kube-system", False),
    ("watcher", "create", "pods/binding", "default", False),
    ("watcher", "patch", "pods", "default", False),
    ("watcher", "create", "events", "default", True),  # NodeCardMismatch on nodes (controller/mismatch.py)
    # extender: get_pod, bind (pods/binding), create_event (core events)
    ("extender", "get", "pods", "default", True),
    ("extender", "create", "pods/binding", "default", True),
    ("extender", "create", "events", "default", True),
    ("extender", "get", "nodes", "", True),  # the node's labels at bind (through system:kube-scheduler)
    ("extender", "list", "nodes", "", True),  # /debug/explain: the nodes' labels (through system:kube-scheduler)
    ("extender", "list", "pods", "kube-system", True),  # the leader hand-over: are its replicas Ready
    ("extender", "patch", "nodes", "", False),
    ("extender", "get", "secrets", "kube-system", False),
    ("extender", "update", "pods", "default", False),
    # webhook: lists the namespace's ResourceQuotas and pods for the quota check (webhook/quotas.py)
    ("webhook", "list", "resourcequotas", "default", True),
    ("webhook", "list", "pods", "default", True),
    ("webhook", "get", "pods", "default", False),
    ("webhook", "watch", "pods", "default", False),
    ("webhook", "update", "resourcequotas/status", "default", False),
    ("webhook", "list", "nodes", "", False),
    ("webhook", "get", "secrets", "kube-system", False),
    # kube-scheduler: its informers and the binding it makes for non-extender pods
    ("kube-scheduler", "watch", "pods", "", True),
    ("kube-scheduler", "list", "nodes", "", True),
    ("kube-scheduler", "create", "pods/binding", "default", True),
    ("kube-scheduler", "get", "secrets", "kube-system", False),
]


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane, redis_server: RedisServer) -> Iterator[Stack]:
    # A short reconcile period, for the reconciler's confirmation below.
    with Stack(control_plane, redis_server.empty().url, "96", settings={"reconcileSeconds": 2}).running() as st:
        yield st


@pytest_asyncio.fixture
async def clients(stack: Stack) -> AsyncIterator[dict[str, Kube]]:
    """A client per role with that role's kubeconfig, and "admin" with the plane's."""
    made = {"admin": await Kube.create(str(stack.cp.kubeconfig_path))}
    for role in ROLES:
        made[role] = await Kube.create(str(stack.kubeconfig(role)))
    try:
        yield made
    finally:
        for k in made.values():
            await k.close()


async def test_every_role_runs_as_its_chart_service_account(stack: Stack, clients: dict[str, Kube]) -> None:
    ids = stack.provision()
    expected = {"kube-scheduler": "hami-scheduler", "extender": "hami-scheduler", "webhook": "hami-webhook",
                "watcher": "hami-watcher"}
    for role, sa in expected.items():
        review = await clients[role].request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                                             {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
        info = review["status"]["userInfo"]
        assert info["username"] == f"system:serviceaccount:kube-system:{sa}" == ids[role].username, info
        assert "system:masters" not in info.get("groups", []), info
    # ... and the running processes use exactly those kubeconfigs.
    for r in stack.roles:
        assert r.proc is not None
        args = [str(a) for a in r.proc.args] if isinstance(r.proc.args, list) else [str(r.proc.args)]
        assert f"kubeconfig={ids[r.kind].kubeconfig}" in args, args
    scheduler = yaml.safe_load((stack.cp.workdir / "scheduler.yaml").read_text())
    assert scheduler["clientConnection"]["kubeconfig"] == str(ids["kube-scheduler"].kubeconfig)


@pytest.mark.parametrize(("role", "verb", "resource", "namespace", "allowed"), ACCESS,
                         ids=[f"{r}-{v}-{res}" for r, v, res, _, _ in ACCESS])
async def test_each_identity_may_make_its_calls_and_no_others(clients: dict[str, Kube], role: str, verb: str,
                                                              resource: str, namespace: str, allowed: bool) -> None:
    res, _, sub = resource.partition("/")
    attrs: dict[str, Any] = {"verb": verb, "group": "", "resource": res, "subresource": sub}
    if namespace:
        attrs["namespace"] = namespace
    review = await clients[role].request(
        "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
         "spec": {"resourceAttributes": attrs}})
    assert bool(review["status"].get("allowed")) is allowed, review["status"]


@pytest.mark.parametrize("role", ["extender", "watcher", "webhook"])
async def test_the_chart_grants_every_call_the_roles_check_they_may_make(clients: dict[str, Kube], role: str) -> None:
    """The roles' own table of their calls (shared/domain/access.py), asked as the roles ask it at run time
    (shared/serving/access.py): a need the chart does not grant would keep a role unready, or a call it makes
    missing from the table would go unwatched (the ACCESS table above lists the calls; both must agree)."""
    # (the extender's with the chart's leader hand-over on: its Lease, in the scheduler's namespace)
    needs = needs_of(role, lease="kube-system/hami-scheduler" if role == "extender" else "")
    probe = AccessProbe(clients[role], needs)
    await probe.check()
    assert probe.denied == {}, probe.denied
    listed = {(r, v, res) for r, v, res, _, allowed in ACCESS if allowed}
    assert {(role, n.verb, n.resource) for n in needs if not n.group} <= listed  # (ACCESS: the core group's)


async def test_forbidden_calls_are_refused_and_the_nudge_goes_through(stack: Stack,
                                                                     clients: dict[str, Kube]) -> None:
    admin, watcher = clients["admin"], clients["watcher"]
    run = uuid.uuid4().hex[:6]
    node, ns = f"s4000-ident-{run}", f"e2e-ident-{run}"
    await admin.request("POST", "/api/v1/nodes", simulated.gpu_node(node, 96, 1, labels={LABEL: run}))
    await admin.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    try:
        # Real calls, not only reviews: what the watcher must not do is refused by the API server.
        for method, path in (("DELETE", f"/api/v1/nodes/{node}"),
                             ("GET", "/api/v1/namespaces/kube-system/secrets")):
            with pytest.raises(KubeError) as info:
                await watcher.request(method, path)
            assert info.value.status == 403, info.value
        with pytest.raises(KubeError) as info:
            await clients["webhook"].request("GET", f"/api/v1/namespaces/{ns}/pods/slice")  # list only
        assert info.value.status == 403, info.value

        # The pod only after the watcher booked the node's cards, else the extender turns it away.
        ledger = Ledger(Redis.from_url(stack.redis_url, decode_responses=True))
        try:
            async def booked() -> bool | None:
                return True if node in await ledger.snapshots([node]) else None

            await until(booked, f"{node} in the ledger", lambda: stack.logs(20))
        finally:
            await ledger.redis.aclose()
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "slice"},
               "spec": {"nodeSelector": {LABEL: run}, "containers": [{
                   "name": "c", "image": "busybox", "resources": {"limits": {
                       "mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "8", "mthreads.com/sgpu-core": "2"}}}]}}
        await admin.request("POST", f"/api/v1/namespaces/{ns}/pods", pod)
        bound = await until(lambda: _bound(admin, ns, "slice"), "the slice pod bound by the extender")
        assert bound["spec"]["nodeName"] == node
        assert FREED_ANNOTATION not in (await _node(admin, node))["metadata"].get("annotations", {})
        # A nudge wakes only pods of ours that wait to be placed (else it is not sent): one that fits nowhere
        parked = {**pod, "metadata": {"name": "parked"},
                  "spec": {**pod["spec"], "nodeSelector": {LABEL: f"{run}-nowhere"}}}
        await admin.request("POST", f"/api/v1/namespaces/{ns}/pods", parked)
        await admin.request("DELETE", f"/api/v1/namespaces/{ns}/pods/slice", {"gracePeriodSeconds": 0})

        # The release is followed by the nudge: a node patch the watcher makes as hami-watcher.
        async def nudged() -> dict[str, Any] | None:
            n = await _node(admin, node)
            return n if FREED_ANNOTATION in n["metadata"].get("annotations", {}) else None

        await until(nudged, f"the watcher's {FREED_ANNOTATION} annotation on {node}",
                     lambda: stack.logs(20))
    finally:
        for name in ("slice", "parked"):
            await admin.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}", {"gracePeriodSeconds": 0},
                                ok=(200, 202, 404))
        await admin.request("DELETE", f"/api/v1/nodes/{node}", ok=(200, 202, 404))


async def _node(kube: Kube, name: str) -> dict[str, Any]:
    node: dict[str, Any] = await kube.request("GET", f"/api/v1/nodes/{name}")
    return node


async def _bound(kube: Kube, ns: str, name: str) -> dict[str, Any] | None:
    pod = await kube.get_pod(ns, name)
    return pod if pod["spec"].get("nodeName") else None


async def test_reconciler_confirms_a_stale_reservation_as_the_watcher(stack: Stack, clients: dict[str, Kube]) -> None:
    """A bound reservation no pod explains is dropped only after the watcher read the pod from the API
    server (404): that GET is made as hami-watcher."""
    admin = clients["admin"]
    run = uuid.uuid4().hex[:6]
    node = f"s4000-ghost-{run}"
    await admin.request("POST", "/api/v1/nodes", simulated.gpu_node(node, 96, 1, labels={LABEL: run}))
    ledger = Ledger(Redis.from_url(stack.redis_url, decode_responses=True))
    try:
        async def booked() -> bool | None:
            return True if node in await ledger.snapshots([node]) else None

        await until(booked, f"{node} in the ledger", lambda: stack.logs(20))
        uid = str(uuid.uuid4())
        outcome, _ = await ledger.reserve(node, uid, [0], 2, 1, 1, pod=f"e2e-ghost-{run}/ghost")
        assert outcome.ok, outcome
        assert await ledger.mark_bound(node, uid)  # bound: the janitor leaves it to the reconciler

        async def dropped() -> bool | None:
            snap = (await ledger.snapshots([node])).get(node)
            return True if snap is not None and uid not in snap.reservations else None

        # Older than the reconciler's keep window (10 s), then a pass every 2 s.
        await until(dropped, f"the ghost reservation on {node} dropped", lambda: stack.logs(20), timeout=40)
    finally:
        await ledger.redis.aclose()
        await admin.request("DELETE", f"/api/v1/nodes/{node}", ok=(200, 202, 404))


async def test_a_patch_of_another_node_wakes_a_pod_the_extender_turned_away(stack: Stack,
                                                                            clients: dict[str, Kube]) -> None:
    """What the watchers' cluster-wide nudge rests on (shared/domain/nudge.py, Nudger.cluster_wide), on this
    kube-scheduler: a pod our extender turned away for node A is tried again when node B's annotation changes, though
    it cannot go to B. Nothing else happens meanwhile: the watcher is down (no release, no nudge of its own), the
    card is given back in the ledger by the test as the watcher would, and the only cluster event is that patch,
    made as the watcher's identity. The running watcher chose that mode from the API server's version."""
    if not any_node_wakes(stack.cp.scheduler_version):  # (MTSCHED_K8S_BIN_DIR: an older control plane)
        pytest.skip(f"{stack.cp.scheduler_version}: the watchers nudge Node by Node there (shared/domain/nudge.py)")
    log = stack.role("watcher").log_path.read_text(errors="replace")
    assert "nudging kube-scheduler with one Node patch for all Nodes" in log, log[-2000:]
    admin, watcher = clients["admin"], clients["watcher"]
    run = uuid.uuid4().hex[:6]
    a, b, ns = f"s4000-wake-a-{run}", f"s4000-wake-b-{run}", f"e2e-wake-{run}"
    for name in (a, b):
        await admin.request("POST", "/api/v1/nodes", simulated.gpu_node(name, 96, 1, labels={LABEL: name}))
    await admin.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    ledger = Ledger(Redis.from_url(stack.redis_url, decode_responses=True))
    killed = False
    try:
        async def in_ledger() -> bool | None:
            return True if {a, b} <= set(await ledger.snapshots([a, b])) else None

        await until(in_ledger, f"{a} and {b} in the ledger", lambda: stack.logs(20))

        def whole_card(name: str) -> dict[str, Any]:  # exclusive: the webhook gives it the whole card
            return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                    "spec": {"nodeSelector": {LABEL: a}, "containers": [{
                        "name": "c", "image": "busybox", "resources": {"limits": {"mthreads.com/vgpu": "1"}}}]}}

        holder = await admin.request("POST", f"/api/v1/namespaces/{ns}/pods", whole_card("holder"))
        await until(lambda: _bound(admin, ns, "holder"), "the holder bound on A")
        stack.kill("watcher")
        killed = True
        await admin.request("DELETE", f"/api/v1/namespaces/{ns}/pods/holder", {"gracePeriodSeconds": 0})
        await admin.request("POST", f"/api/v1/namespaces/{ns}/pods", whole_card("waiter"))

        async def parked() -> bool | None:  # tried, turned away (A's card still booked), and left waiting
            pod = await admin.get_pod(ns, "waiter")
            cond = [c for c in pod.get("status", {}).get("conditions", []) if c.get("type") == "PodScheduled"]
            return True if cond and cond[0].get("reason") == "Unschedulable" else None

        await until(parked, "the waiter turned away by the extender", lambda: stack.logs(20))
        assert await ledger.release(a, holder["metadata"]["uid"])  # what the watcher does when it sees the delete
        await watcher.request("PATCH", f"/api/v1/nodes/{b}",
                              {"metadata": {"annotations": {FREED_ANNOTATION: str(int(time.time() * 1000))}}},
                              content_type="application/merge-patch+json")
        bound = await until(lambda: _bound(admin, ns, "waiter"), "the waiter bound on A after B's patch",
                            lambda: stack.logs(20), timeout=60)
        assert bound["spec"]["nodeName"] == a
    finally:
        if killed:
            stack.respawn("watcher")
        await ledger.redis.aclose()
        for name in ("holder", "waiter"):
            await admin.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}", {"gracePeriodSeconds": 0},
                                ok=(200, 202, 404))
        for name in (a, b):
            await admin.request("DELETE", f"/api/v1/nodes/{name}", ok=(200, 202, 404))
