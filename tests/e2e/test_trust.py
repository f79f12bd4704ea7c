"""Only our bind writes allocations (issue 11 item 1), through the real API server.

The stack runs every role as its chart ServiceAccount with the chart's RBAC and its admission policy
(deploy/helm/hami/templates/webhook/admissionpolicy.yaml, applied by deploy/local/identities.py). An
ordinary user, `tenant` (a ServiceAccount allowed to create, read, change and delete pods in its own
namespace only), tries what the reported failures did:

(a) grow or move a booking by rewriting `hami.io/mthreads-vgpu-devices-allocated` after admission,
    overwrite `mthreads.com/gpu-index`, `mthreads.com/predicate-time`, `hami.io/bind-phase`: refused,
    for cluster admins and kube-scheduler's own identity too, while our bind still writes them;
(b) skip the webhook with the label `mtsched.io/webhook: ignore`: the pod is judged like any other;
(c) preset `spec.nodeName` on a pod asking for slices: refused, even where no webhook looks.
And for a cluster without the policy (suspended here): a forged record on a CPU pod books nothing
(4 whole-card pods after it are placed), and a record changed after our bind leaves the booking as
the bind made it, through the watcher, the reconciler and a watcher restart (its rebuild).
"""

from __future__ import annotations

import asyncio
import json
import re
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio
from redis.asyncio import Redis

from deploy.local.controlplane import ControlPlane
from deploy.local.identities import ADMISSION, load_manifest
from deploy.local.redis import RedisServer
from deploy.local.stack import Stack
from shared.domain.annotations import ALLOCATED, BIND_PHASE, GPU_INDEX, PREDICATE_TIME, SCHEDULER_OWNED_KEYS
from shared.domain.state import NodeSnapshot
from shared.domain.trust import refused_by_own_policy
from shared.kube import Kube, KubeError
from shared.store.ledger import Ledger
from tests.e2e._tenant import tenancy
from tests.e2e._wait import until

pytestmark = pytest.mark.e2e

LABEL = "mtsched.io/e2e-trust"
POLICY = "ValidatingAdmissionPolicy 'hami-allocation-records'"
SLICE = {"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "2", "mthreads.com/sgpu-core": "1"}
WHOLE = {"mthreads.com/vgpu": "1"}
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
BOUND_WITHIN = 30.0


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane, redis_server: RedisServer) -> Iterator[Stack]:
    # A short reconcile period, so a repair pass over the changed record comes within the test.
    with Stack(control_plane, redis_server.empty().url, "96", settings={"reconcileSeconds": 2}).running() as st:
        yield st


@dataclass
class Env:
    stack: Stack
    admin: Kube
    user: Kube  # the tenant
    ledger: Ledger
    ns: str
    node: str
    run: str

    def pod(self, name: str, limits: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name}
        for key in ("labels", "annotations"):
            if key in spec:
                meta[key] = spec.pop(key)
        container: dict[str, Any] = {"name": "main", "image": "busybox"}
        if limits:
            container["resources"] = {"limits": limits}
        if "securityContext" in spec:
            container["securityContext"] = spec.pop("securityContext")
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
                "spec": {"nodeSelector": {LABEL: self.run}, "containers": [container], **spec}}

    def path(self, name: str = "") -> str:
        return f"/api/v1/namespaces/{self.ns}/pods" + (f"/{name}" if name else "")

    async def create(self, pod: dict[str, Any], kube: Kube | None = None) -> dict[str, Any]:
        out: dict[str, Any] = await (kube or self.user).request("POST", self.path(), pod)
        return out

    async def get(self, name: str) -> dict[str, Any]:
        return await self.admin.get_pod(self.ns, name)

    async def bound(self, name: str) -> dict[str, Any]:
        async def check() -> dict[str, Any] | None:
            p = await self.get(name)
            return p if p["spec"].get("nodeName") else None

        got: dict[str, Any] = await until(check, f"{name} bound", self.stack.logs, BOUND_WITHIN)
        return got

    async def snapshot(self) -> NodeSnapshot:
        snap = (await self.ledger.snapshots([self.node])).get(self.node)
        assert snap is not None, f"{self.node} is not in the ledger"
        return snap

    async def refused(self, method: str, path: str, body: Any, kube: Kube | None = None,
                      content_type: str = "application/json") -> str:
        with pytest.raises(KubeError) as info:
            await (kube or self.user).request(method, path, body, content_type=content_type)
        assert info.value.status == 403, info.value
        return str(info.value)


@pytest_asyncio.fixture
async def env(stack: Stack) -> AsyncIterator[Env]:
    async with tenancy(stack, "trust", LABEL) as t:
        ledger = Ledger(Redis.from_url(stack.redis_url, decode_responses=True))
        try:
            async def listed() -> bool | None:
                return True if t.node in await ledger.snapshots([t.node]) else None

            await until(listed, f"{t.node} in the ledger", stack.logs)  # else the extender turns pods away
            yield Env(stack, t.admin, t.user, ledger, t.ns, t.node, t.run)
        finally:
            await ledger.redis.aclose()


def metric(stack: Stack, name: str, labels: str = "") -> float:
    """Sum of a counter over the watcher replicas (`labels`: e.g. 'kind="changed"')."""
    total = 0.0
    for role in (r for r in stack.roles if r.kind == "watcher"):
        for line in stack.metrics(role).splitlines():
            if line.startswith(name) and labels in line and not line.startswith(f"{name}_created"):
                total += float(line.rsplit(" ", 1)[1])
    return total


def impersonated(cp: ControlPlane, user: str, method: str, path: str, body: Any,
                 content_type: str = MERGE) -> tuple[int, str]:
    """A request as `user` (the admin impersonates it): what kube-scheduler's own identity may do."""
    req = urllib.request.Request(cp.server_url + path, data=json.dumps(body).encode(), method=method)
    for k, v in (("Authorization", f"Bearer {cp.token}"), ("Content-Type", content_type),
                 ("Impersonate-User", user), ("Impersonate-Group", "system:authenticated")):
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=30, context=cp.client_ssl_context()) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode()


def record(node: str, *cards: tuple[int, int, int]) -> str:
    """An allocation record for one container: (card, units, cores) per card."""
    return "".join(f"{node}-mthreads-{c},Mthreads,{units * 512},{cores}:" for c, units, cores in cards) + ";"


def booking(snap: NodeSnapshot, uid: str) -> tuple[tuple[int, ...], int, int, int]:
    r = snap.reservations[uid]
    return r.cards, r.mem, r.cores, r.slices


# -- (a) nobody rewrites a record after admission ---------------------------------------------------

async def test_records_cannot_be_rewritten_after_admission(env: Env) -> None:
    await env.create(env.pod("slice", SLICE))
    pod = await env.bound("slice")  # our bind writes the record under the policy
    ann = pod["metadata"]["annotations"]
    uid = pod["metadata"]["uid"]
    [card] = (await env.snapshot()).reservations[uid].cards
    assert ann[ALLOCATED] == record(env.node, (card, 2, 1))
    other = (card + 1) % 4

    forged = {
        "grown to the whole card": {ALLOCATED: record(env.node, (card, 96, 16))},
        "moved to another card": {ALLOCATED: record(env.node, (other, 2, 1)), GPU_INDEX: str(other)},
        GPU_INDEX: {GPU_INDEX: str(other)},
        PREDICATE_TIME: {PREDICATE_TIME: "1"},
        BIND_PHASE: {BIND_PHASE: "success"},
        "removed": {ALLOCATED: None},
    }
    for what, change in forged.items():
        msg = await env.refused("PATCH", env.path("slice"), {"metadata": {"annotations": change}},
                                content_type=MERGE)
        assert POLICY in msg and "written only by hami-scheduler" in msg, (what, msg)
        assert "system:serviceaccount:" + env.ns + ":tenant may not set, change or remove" in msg, msg
    # a whole-object update (kubectl replace/edit) and a JSON patch are judged alike
    replaced = await env.get("slice")
    replaced["metadata"]["annotations"][ALLOCATED] = record(env.node, (card, 96, 16))
    await env.refused("PUT", env.path("slice"), replaced)
    await env.refused("PATCH", env.path("slice"), [{"op": "replace", "path": "/metadata/annotations/"
                                                    + ALLOCATED.replace("/", "~1"), "value": "x;"}],
                      content_type=JSON_PATCH)
    # cluster admins are not exempt (nobody but our bind writes records) ...
    msg = await env.refused("PATCH", env.path("slice"), {"metadata": {"annotations": {GPU_INDEX: str(other)}}},
                            kube=env.admin, content_type=MERGE)
    assert "harness-admin may not" in msg
    # ... nor kube-scheduler's own identity, through the status subresource (which may change annotations)
    status, body = await asyncio.to_thread(impersonated, env.stack.cp, "system:kube-scheduler", "PATCH",
                                           env.path("slice") + "/status",
                                           {"metadata": {"annotations": {GPU_INDEX: str(other)}}})
    assert status == 403 and POLICY in body, body
    # ... nor a Binding carrying a record (its annotations reach the pod without a pod UPDATE)
    loose = await env.create(env.pod("cpu-unbound", schedulerName="nobody"), kube=env.admin)
    binding = {"apiVersion": "v1", "kind": "Binding",
               "metadata": {"name": "cpu-unbound", "annotations": {ALLOCATED: record(env.node, (other, 96, 16))}},
               "target": {"apiVersion": "v1", "kind": "Node", "name": env.node}}
    msg = await env.refused("POST", env.path("cpu-unbound") + "/binding", binding, kube=env.admin)
    assert "may only be made by hami-scheduler" in msg
    # the extender, refused so, knows it runs as the wrong identity (unready: controller/extender.py bindings_problem)
    assert refused_by_own_policy(403, msg, "hami-scheduler") and not refused_by_own_policy(403, msg, "other"), msg
    assert not (await env.get(loose["metadata"]["name"]))["spec"].get("nodeName")

    # other changes still go through, and neither the pod nor the ledger moved
    await env.user.request("PATCH", env.path("slice"), {"metadata": {"labels": {"team": "ml"},
                                                                     "annotations": {"note": "mine"}}},
                           content_type=MERGE)
    after = await env.get("slice")
    for key in (ALLOCATED, GPU_INDEX, PREDICATE_TIME, BIND_PHASE):
        assert after["metadata"]["annotations"][key] == ann[key], key
    assert booking(await env.snapshot(), uid) == ((card,), 2, 1, 1)


async def test_a_cpu_pod_cannot_be_given_a_record(env: Env) -> None:
    await env.create(env.pod("cpu", {"cpu": "1"}))
    whole = record(env.node, *((c, 96, 16) for c in range(4)))
    msg = await env.refused("PATCH", env.path("cpu"), {"metadata": {"annotations": {ALLOCATED: whole}}},
                            content_type=MERGE)
    assert POLICY in msg
    # nor created with one, wherever it is created (the policy is not scoped by namespace)
    msg = await env.refused("POST", env.path(), env.pod("cpu2", {"cpu": "1"}, annotations={ALLOCATED: whole}))
    assert "written by hami-scheduler" in msg


# -- (b), (c) admission cannot be skipped ------------------------------------------------------------

IGNORE = {"mtsched.io/webhook": "ignore", "hami.io/webhook": "ignore"}


async def test_the_old_ignore_label_skips_nothing(env: Env) -> None:
    cases = {
        "privileged": (env.pod("priv", SLICE, labels=IGNORE, schedulerName="hami-scheduler",
                               securityContext={"privileged": True}), "is privileged"),
        "preset record": (env.pod("rec", SLICE, labels=IGNORE, annotations={ALLOCATED: record(env.node, (0, 2, 1))}),
                          "written by hami-scheduler"),
        "preset node": (env.pod("pinned", SLICE, labels=IGNORE, nodeName=env.node), "spec.nodeName"),
        "invalid size": (env.pod("odd", {**SLICE, "mthreads.com/sgpu-memory": "3"}, labels=IGNORE),
                         "not a valid slice size"),
    }
    for what, (pod, why) in cases.items():
        with pytest.raises(KubeError) as info:
            await env.create(pod)
        assert info.value.status in (400, 403) and why in str(info.value), (what, info.value)
    # a valid one is mutated (routed to our scheduler) and placed by our bind like any other
    await env.create(env.pod("labelled", SLICE, labels=IGNORE))
    pod = await env.bound("labelled")
    assert pod["spec"]["schedulerName"] == "hami-scheduler"
    assert ALLOCATED in pod["metadata"]["annotations"]
    # the exclusion that remains is by namespace, and a tenant cannot label its namespace
    with pytest.raises(KubeError) as info:
        await env.user.request("PATCH", f"/api/v1/namespaces/{env.ns}", {"metadata": {"labels": IGNORE}},
                               content_type=MERGE)
    assert info.value.status == 403


async def test_preset_node_name_is_refused_where_no_webhook_looks(env: Env) -> None:
    # a namespace the admin excluded from the webhook (the harness's baseline namespaces): only the
    # policy judges pods there, and it refuses a slice pod that would skip our scheduler
    skipped = f"{env.ns}-nowebhook"
    await env.admin.request("POST", "/api/v1/namespaces", {"metadata": {"name": skipped, "labels": IGNORE}})
    pod = env.pod("pinned", SLICE, nodeName=env.node)
    msg = await env.refused("POST", f"/api/v1/namespaces/{skipped}/pods", pod, kube=env.admin)
    assert POLICY in msg and f'spec.nodeName "{env.node}" is set' in msg, msg
    # asked for by an init container only (extended resources under requests alone are invalid anyway)
    variant = env.pod("pinned", None, nodeName=env.node)
    variant["spec"]["initContainers"] = [{"name": "init", "image": "busybox", "resources": {"limits": SLICE}}]
    await env.refused("POST", f"/api/v1/namespaces/{skipped}/pods", variant, kube=env.admin)
    # a pod asking for no slice may still name its node
    await env.admin.request("POST", f"/api/v1/namespaces/{skipped}/pods", env.pod("cpu", nodeName=env.node))
    await env.admin.request("DELETE", f"/api/v1/namespaces/{skipped}/pods/cpu", {"gracePeriodSeconds": 0})


# -- what the policy judges: only what it could refuse ---------------------------------------------------

async def test_the_policy_judges_only_requests_it_could_refuse(env: Env) -> None:
    """The chart policy's matchConditions (could-be-refused) on the real API server: a probe policy with
    them and one validation that refuses everything, bound to a namespace no webhook sees. What it lets
    through is what the chart's policy skips without building its variables (most of its cost on every
    pod of a cluster); what it refuses covers every request the chart's validations can refuse."""
    [chart] = [o for o in load_manifest() if o["kind"] == "ValidatingAdmissionPolicy"
               and o["metadata"]["name"].endswith("-allocation-records")]
    name, ns = f"gate-probe-{env.run}", f"{env.ns}-gate"
    probe = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
             "metadata": {"name": name},
             "spec": {"failurePolicy": "Fail", "matchConstraints": chart["spec"]["matchConstraints"],
                      "matchConditions": chart["spec"]["matchConditions"],
                      "validations": [{"expression": "false", "message": "judged", "reason": "Forbidden"}]}}
    binding = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
               "metadata": {"name": name},
               "spec": {"policyName": name, "validationActions": ["Deny"],
                        "matchResources": {"namespaceSelector": {"matchLabels": {LABEL: env.run}}}}}
    pods, admin = f"/api/v1/namespaces/{ns}/pods", env.admin
    cpu = env.pod("cpu", {"cpu": "1"}, schedulerName="nobody")  # nothing binds it but this test
    carrying = env.pod("carrying", {"cpu": "1"}, schedulerName="nobody", annotations={ALLOCATED: "x"})

    async def judged(method: str, path: str, body: Any, content_type: str = "application/json") -> bool:
        try:
            await admin.request(method, path, body, content_type=content_type)
            return False
        except KubeError as e:
            if e.status == 403 and "judged" in str(e):
                return True
            raise

    await admin.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns, "labels": {**IGNORE, LABEL: env.run}}})
    with env.stack.policy_suspended():  # the chart's own policy would refuse some of these first
        try:
            await admin.request("POST", pods, carrying)  # before the probe: a pod that carries a record
            await admin.request("POST", pods, cpu)
            await admin.request("POST", f"{ADMISSION}/validatingadmissionpolicies", probe)
            await admin.request("POST", f"{ADMISSION}/validatingadmissionpolicybindings", binding)
            named, dry = env.pod("named", {"cpu": "1"}, nodeName=env.node), f"{pods}?dryRun=All"

            async def in_effect() -> bool | None:
                return True if await judged("POST", dry, named) else None

            await until(in_effect, "the probe policy in effect", env.stack.logs)

            def bind(legacy: bool = False, **annotations: str) -> tuple[str, str, dict[str, Any]]:
                path = f"/api/v1/namespaces/{ns}/bindings" if legacy else f"{pods}/cpu/binding"
                return ("POST", f"{path}?dryRun=All",
                        {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "cpu", "annotations": annotations},
                         "target": {"kind": "Node", "name": env.node}})

            let_out = {
                "a CPU pod": ("POST", dry, env.pod("c2", {"cpu": "1"})),
                "a pod asking for slices, routed to our scheduler": (
                    "POST", dry, env.pod("s", SLICE, schedulerName="hami-scheduler")),
                "a pod with other annotations": ("POST", dry, env.pod("o", {"cpu": "1"}, annotations={"a/b": "c"})),
                "a label change": ("PATCH", f"{pods}/cpu", {"metadata": {"labels": {"x": "y"}}}),
                "a status change": ("PATCH", f"{pods}/cpu/status", {"status": {"message": "m"}}),
                "a Binding without a record": bind(),
                "a legacy Binding without one": bind(legacy=True, **{"a/b": "c"}),
            }
            judged_ones = {
                "a create naming a node": ("POST", dry, named),
                # where no webhook looks (this namespace), another scheduler would place it
                # (tests/e2e/test_redteam_user_ignored_namespace.py)
                "a pod asking for slices, not routed to our scheduler": ("POST", dry, env.pod("s", SLICE)),
                **{f"a create carrying {k}": ("POST", dry, env.pod("k", {"cpu": "1"}, annotations={k: "x"}))
                   for k in SCHEDULER_OWNED_KEYS},
                "an update adding a record": ("PATCH", f"{pods}/cpu", {"metadata": {"annotations": {ALLOCATED: "x"}}}),
                "a status update adding one": ("PATCH", f"{pods}/cpu/status",
                                               {"metadata": {"annotations": {GPU_INDEX: "0"}}}),
                "an update removing a record": ("PATCH", f"{pods}/carrying",
                                                {"metadata": {"annotations": {ALLOCATED: None}}}),
                "an update leaving a record as it is": ("PATCH", f"{pods}/carrying",
                                                        {"metadata": {"labels": {"x": "y"}}}),
                "a Binding carrying a record": bind(**{BIND_PHASE: "success"}),
                "a legacy Binding carrying one": bind(legacy=True, **{ALLOCATED: ""}),
                "an update emptying a record": ("PATCH", f"{pods}/carrying", {"metadata": {"annotations": None}}),
            }
            for what, (method, path, body) in let_out.items():
                assert not await judged(method, path, body, MERGE if method == "PATCH" else "application/json"), what
            for what, (method, path, body) in judged_ones.items():
                assert await judged(method, path, body, MERGE if method == "PATCH" else "application/json"), what
        finally:
            await admin.request("DELETE", f"{ADMISSION}/validatingadmissionpolicybindings/{name}", ok=(200, 202, 404))
            await admin.request("DELETE", f"{ADMISSION}/validatingadmissionpolicies/{name}", ok=(200, 202, 404))
            # its pods too: the namespace never finishes deleting here, and every later watcher would list them
            await admin.request("DELETE", pods, query={"gracePeriodSeconds": "0"}, ok=(200, 202, 404))
            await admin.request("DELETE", f"/api/v1/namespaces/{ns}", ok=(200, 202, 404))


# -- without the policy: the ledger's own defence ------------------------------------------------------

async def test_a_forged_record_on_a_cpu_pod_books_nothing(env: Env) -> None:
    whole = record(env.node, *((c, 96, 16) for c in range(4)))  # every card of the node, whole
    before = metric(env.stack, "mtsched_record_mismatch_total", 'kind="foreign"')
    with env.stack.policy_suspended():
        cpu = await env.create(env.pod("cpu", {"cpu": "1"}, nodeName=env.node))
        await env.user.request("PATCH", env.path("cpu"), {"metadata": {"annotations": {ALLOCATED: whole}}},
                               content_type=MERGE)
        uid = cpu["metadata"]["uid"]

        async def seen() -> bool | None:
            if metric(env.stack, "mtsched_record_mismatch_total", 'kind="foreign"') > before:
                return True
            return True if uid in (await env.snapshot()).reservations else None  # (what c04b156 did)

        await until(seen, "the watcher to judge the forged record", env.stack.logs)
        assert uid not in (await env.snapshot()).reservations
        for i in range(4):
            await env.create(env.pod(f"whole-{i}", WHOLE))
        placed = [await env.bound(f"whole-{i}") for i in range(4)]
    assert sorted(p["metadata"]["annotations"][GPU_INDEX] for p in placed) == ["0", "1", "2", "3"]
    assert uid not in (await env.snapshot()).reservations


async def test_a_record_changed_after_bind_leaves_the_booking(env: Env) -> None:
    await env.create(env.pod("slice", SLICE))
    pod = await env.bound("slice")
    uid = pod["metadata"]["uid"]

    async def marked() -> bool | None:
        snap = await env.snapshot()
        return True if uid in snap.reservations and snap.reservations[uid].state == "bound" else None

    await until(marked, "the booking marked bound", env.stack.logs)
    [card] = (await env.snapshot()).reservations[uid].cards
    want = ((card,), 2, 1, 1)
    before = metric(env.stack, "mtsched_record_mismatch_total", 'kind="changed"')
    runs = metric(env.stack, "mtsched_reconcile_runs_total")
    with env.stack.policy_suspended():
        await env.admin.request("PATCH", env.path("slice"), {"metadata": {"annotations": {
            ALLOCATED: record(env.node, (card, 96, 16))}}}, content_type=MERGE)

        async def judged() -> bool | None:
            if metric(env.stack, "mtsched_record_mismatch_total", 'kind="changed"') > before:
                return True
            return True if booking(await env.snapshot(), uid) != want else None  # (what c04b156 did)

        await until(judged, "the watcher to judge the changed record", env.stack.logs)
        assert booking(await env.snapshot(), uid) == want
        # the card keeps its free share: a 64-unit slice pinned to it still fits (2 + 64 <= 96)
        await env.create(env.pod("neighbour", {**SLICE, "mthreads.com/sgpu-memory": "64"},
                                 annotations={"mthreads.ai/use-gpuuuid": f"{env.node}-mthreads-{card}"}))
        assert (await env.bound("neighbour"))["metadata"]["annotations"][GPU_INDEX] == str(card)

        # the reconciler, once the booking is older than its keep window (10 s), keeps it too
        async def passed() -> bool | None:
            return True if metric(env.stack, "mtsched_reconcile_runs_total") >= runs + 6 else None

        await until(passed, "reconcile passes past the keep window", env.stack.logs, timeout=60)
        assert booking(await env.snapshot(), uid) == want
        # and so does the rebuild of a restarted watcher, over the state Redis still holds
        await asyncio.to_thread(env.stack.restart, "watcher")
        assert booking(await env.snapshot(), uid) == want
    log = env.stack.role("watcher").log_path.read_text(errors="replace")
    assert re.search(rf"{env.ns}/slice: its allocation record changed after our bind", log), env.stack.logs(40)


# -- (d) the chart's identities write only what their roles need -------------------------------------------------

LEASES = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"


async def _refused_as(cp: ControlPlane, user: str, method: str, path: str, body: Any,
                      content_type: str = MERGE) -> str:
    """The first 403 (policies reach the admission chain through an informer: waited for, bounded)."""
    async def check() -> str | None:
        status, text = await asyncio.to_thread(impersonated, cp, user, method, path, body, content_type)
        return text if status == 403 else None

    got: str = await until(check, f"{user} refused {method} {path}")
    return got


async def test_the_watchers_may_write_only_the_nudge_annotation_of_a_node_and_events_in_default(env: Env) -> None:
    """RBAC lets the watchers patch every field of every Node; the chart's policy (watcher-writes) keeps them to
    the annotation their nudge sets. Their events go to `default` only (a Role there, not a ClusterRole)."""
    cp, watcher = env.stack.cp, env.stack.provision()["watcher"].username
    node = f"/api/v1/nodes/{env.node}"
    for patch in ({"metadata": {"labels": {"example.com/x": "y"}}},
                  {"metadata": {"annotations": {"example.com/other": "x"}}},
                  {"spec": {"unschedulable": True}},
                  {"spec": {"taints": [{"key": "example.com/t", "effect": "NoSchedule"}]}},
                  {"metadata": {"finalizers": ["example.com/never"]}}):
        text = await _refused_as(cp, watcher, "PATCH", node, patch)
        assert "only the annotation mtsched.io/capacity-freed" in text, (patch, text)
    status, text = await asyncio.to_thread(impersonated, cp, watcher, "PATCH", node,
                                           {"metadata": {"annotations": {"mtsched.io/capacity-freed": "1"}}})
    assert status == 200, text
    meta = (await env.admin.request("GET", node))["metadata"]
    assert "example.com/x" not in (meta.get("labels") or {}) and not meta.get("finalizers")
    event = {"apiVersion": "v1", "kind": "Event", "metadata": {"generateName": "probe-"},
             "involvedObject": {"kind": "Node", "name": env.node}, "reason": "Probe", "message": "probe",
             "type": "Normal"}
    status, _ = await asyncio.to_thread(impersonated, cp, watcher, "POST", f"/api/v1/namespaces/{env.ns}/events",
                                        event, "application/json")
    assert status == 403
    status, text = await asyncio.to_thread(impersonated, cp, watcher, "POST", "/api/v1/namespaces/default/events",
                                           event, "application/json")
    assert status == 201, text


async def test_the_scheduler_may_write_only_its_own_lease(env: Env) -> None:
    """system:kube-scheduler, which our kube-scheduler needs, also grants writes to the default scheduler's Lease
    (kube-system/kube-scheduler) and to lease candidates; the chart's policy (scheduler-leases) leaves our
    ServiceAccount, the extender's too, its own Lease only."""
    cp, ident = env.stack.cp, env.stack.provision()["kube-scheduler"]
    default = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
               "metadata": {"name": "kube-scheduler", "namespace": "kube-system"},
               "spec": {"holderIdentity": "default-scheduler-0", "leaseDurationSeconds": 15}}
    await env.admin.request("POST", LEASES.format(ns="kube-system"), default, ok=(201, 409))
    held = await env.admin.request("GET", LEASES.format(ns="kube-system") + "/kube-scheduler")
    taken = {**held, "spec": {**held["spec"], "holderIdentity": "hami-scheduler-0"}}
    # an update, which RBAC grants (system:kube-scheduler: get and update of the Lease kube-scheduler)
    text = await _refused_as(cp, ident.username, "PUT", LEASES.format(ns="kube-system") + "/kube-scheduler",
                             taken, "application/json")
    assert "may write only its own Lease" in text, text
    other = {**default, "metadata": {"name": "someone-else", "namespace": ident.namespace}}
    text = await _refused_as(cp, ident.username, "POST", LEASES.format(ns=ident.namespace), other, "application/json")
    assert "may write only its own Lease" in text, text
    own = {**default, "metadata": {"name": "hami-scheduler", "namespace": ident.namespace},
           "spec": {"holderIdentity": "hami-scheduler-0", "leaseDurationSeconds": 15}}
    status, text = await asyncio.to_thread(impersonated, cp, ident.username, "POST", LEASES.format(ns=ident.namespace),
                                           own, "application/json")
    assert status in (201, 409), text
    mine = await env.admin.request("GET", LEASES.format(ns=ident.namespace) + "/hami-scheduler")
    status, text = await asyncio.to_thread(impersonated, cp, ident.username, "PUT",
                                           LEASES.format(ns=ident.namespace) + "/hami-scheduler",
                                           {**mine, "spec": {**mine["spec"], "holderIdentity": "hami-scheduler-1"}},
                                           "application/json")
    assert status == 200, text
    held = await env.admin.request("GET", LEASES.format(ns="kube-system") + "/kube-scheduler")
    assert held["spec"]["holderIdentity"] == "default-scheduler-0"
