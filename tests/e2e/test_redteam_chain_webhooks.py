"""Red team (the admission chain): another mutating webhook (a sidecar injector, a policy engine's mutation)
runs after ours and changes the pod we admitted. The API server stores what the last webhook left; the admission
policy (validating, after every mutating webhook) and the extender (on kube-scheduler's copy, the stored pod) are
what still stands between that pod and a card.

Found:
- a later webhook that takes `mthreads.com/vgpu` away and leaves `sgpu-memory`/`sgpu-core` (our webhook had routed
  the pod to hami-scheduler): kube-scheduler called the extender only for pods naming `vgpu` (the chart's
  `managedResources`), so it bound this one itself, on card memory nobody booked (and its record-less slice then
  closed the node to every slice pod). Now the extender is asked about every pod naming one of our resources and
  keeps it Pending with the rule it breaks.
- a later webhook making the slice container privileged (it then sees every card): placed as any slice. Now the
  extender refuses it, with the webhook's words.
- a later webhook writing an `sgpu-memory` no card model accepts: Pending with `1/1 CardTypeMismatch` only. Now
  the reason names the value and what is allowed.

Held: schedulerName, nodeName and scheduler-owned annotations set by a later webhook, and a slice it gives a pod our
webhook never judged, are refused by the admission policy; cores above 16 and a second exclusive container stay
Pending with the extender's reason.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web

from deploy.local import nodes as simulated
from deploy.local.controlplane import ControlPlane
from deploy.local.redis import RedisServer
from deploy.local.stack import Stack
from shared.domain.annotations import ALLOCATED
from shared.kube import Kube, KubeError
from tests.e2e._wait import until

pytestmark = pytest.mark.e2e

PATCH = "e2e.chain/patch"  # the JSONPatch the later webhook applies, carried by the pod itself
LABEL = "mtsched.io/e2e-chain"
POLICY = "ValidatingAdmissionPolicy 'hami-allocation-records'"
SLICE = {"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "32", "mthreads.com/sgpu-core": "4"}


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane, redis_server: RedisServer) -> Iterator[Stack]:
    with Stack(control_plane, redis_server.empty().url, "96").running() as st:
        yield st


async def mutate(request: web.Request) -> web.Response:
    """A later mutating webhook: applies the JSONPatch the pod names in PATCH (after ours: `zz-` sorts last)."""
    review = await request.json()
    pod = review["request"]["object"]
    ops = json.loads(((pod.get("metadata") or {}).get("annotations") or {}).get(PATCH, "[]"))
    response: dict[str, Any] = {"uid": review["request"]["uid"], "allowed": True}
    if ops:
        response |= {"patchType": "JSONPatch", "patch": base64.b64encode(json.dumps(ops).encode()).decode()}
    return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})


async def a_later_webhook(stack: Stack, admin: Kube, https_server: Any, ns: str, run: str) -> None:
    """The namespace `ns` (labelled `run`) and a mutating webhook after ours (`zz-` sorts last) sent its pods."""
    app = web.Application()
    app.router.add_post("/mutate", mutate)
    url = await https_server(app)
    await admin.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns, "labels": {LABEL: run}}})
    await stack.cp.register_webhooks_async(url + "/mutate", name=f"zz-chain-{run}",
                                           namespace_selector={"matchLabels": {LABEL: run}})


def pod(name: str, run: str, ops: list[dict[str, Any]], limits: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": {PATCH: json.dumps(ops)}},
            "spec": {"nodeSelector": {LABEL: run}, "containers": [
                {"name": "main", "image": "busybox", "resources": {"limits": dict(limits or SLICE)}}]}}


LIM, REQ = "/spec/containers/0/resources/limits", "/spec/containers/0/resources/requests"


async def test_a_later_webhook_cannot_get_a_pod_past_our_rules(
        stack: Stack, admin: Kube, https_server: Any) -> None:
    run = uuid.uuid4().hex[:6]
    ns, node = f"e2e-chain-{run}", f"s4000-chain-{run}"
    await a_later_webhook(stack, admin, https_server, ns, run)
    await admin.request("POST", "/api/v1/nodes", simulated.gpu_node(node, 96, 2, labels={LABEL: run}))
    pods = f"/api/v1/namespaces/{ns}/pods"
    try:
        # the later webhook runs: a pod it leaves valid is placed and booked as always
        await admin.request("POST", pods, pod("valid", run, [{"op": "add", "path": "/metadata/labels",
                                                              "value": {"injected": "yes"}}]))

        async def placed() -> dict[str, Any] | None:
            p: dict[str, Any] = await admin.get_pod(ns, "valid")
            return p if p["spec"].get("nodeName") else None

        got = await until(placed, "the valid pod bound", stack.logs, 30.0)
        assert got["metadata"]["labels"] == {"injected": "yes"} and ALLOCATED in got["metadata"]["annotations"]

        # refused by the admission policy, whatever our webhook had admitted
        for what, ops, said in [
            ("schedulerName", [{"op": "replace", "path": "/spec/schedulerName", "value": "default-scheduler"}],
             'must name schedulerName "hami-scheduler"'),
            ("nodeName", [{"op": "add", "path": "/spec/nodeName", "value": node}], f'spec.nodeName "{node}" is set'),
            ("a record", [{"op": "add", "path": "/metadata/annotations/mthreads.com~1gpu-index", "value": "0"}],
             "are written by hami-scheduler when it binds the pod"),
        ]:
            with pytest.raises(KubeError) as info:
                await admin.request("POST", pods, pod(f"policy-{what.replace(' ', '-').lower()}", run, ops))
            assert info.value.status == 403 and POLICY in str(info.value) and said in str(info.value), (what, info)

        # a pod our webhook never judged (it asked for no card: not sent, matchConditions), given a slice later
        with pytest.raises(KubeError) as info:
            await admin.request("POST", pods, pod("cpu-made-gpu", run, [{"op": "add", "path": LIM, "value": SLICE}],
                                                  {"cpu": "100m"}))
        assert info.value.status == 403 and 'must name schedulerName "hami-scheduler"' in str(info.value), info.value

        # held Pending by the extender, with the rule the final pod breaks
        pending = {
            "no-vgpu": ([{"op": "remove", "path": f"{where}/mthreads.com~1vgpu"} for where in (LIM, REQ)],
                        "mthreads.com/sgpu-memory/mthreads.com/sgpu-core need mthreads.com/vgpu"),
            "privileged": ([{"op": "add", "path": "/spec/containers/0/securityContext",
                             "value": {"privileged": True}}], 'container "main" is privileged'),
            "bad-memory": ([{"op": "replace", "path": f"{where}/mthreads.com~1sgpu-memory", "value": "3"}
                            for where in (LIM, REQ)],
                           "mthreads.com/sgpu-memory=3 is not a valid slice size; allowed: 2, 4, 8, 16, 32, 64, 96"),
            "cores-17": ([{"op": "replace", "path": f"{where}/mthreads.com~1sgpu-core", "value": "17"}
                          for where in (LIM, REQ)],
                         "mthreads.com/sgpu-core=17 is outside 1..16"),
            "second-exclusive": ([{"op": "add", "path": "/spec/containers/-", "value": {
                "name": "injected", "image": "busybox", "resources": {"limits": {"mthreads.com/vgpu": "1"}}}}],
                "exclusive containers"),
        }
        for name, (ops, _) in pending.items():
            await admin.request("POST", pods, pod(name, run, ops))
        for name, (_, said) in pending.items():

            async def refused(name: str = name, said: str = said) -> str | None:
                p: dict[str, Any] = await admin.get_pod(ns, name)
                assert not p["spec"].get("nodeName"), (name, "placed", p["metadata"].get("annotations"))
                for c in (p.get("status") or {}).get("conditions") or []:
                    if c.get("type") == "PodScheduled" and c.get("status") == "False" and said in c.get("message", ""):
                        return str(c["message"])
                return None

            await until(refused, f"{name} Pending with {said!r}", stack.logs, 30.0)
        for name in pending:  # still unplaced after the scheduler's retries
            p = await admin.get_pod(ns, name)
            assert not p["spec"].get("nodeName"), (name, p["spec"].get("nodeName"))
    finally:
        await admin.request("DELETE", pods, query={"gracePeriodSeconds": "0"}, ok=(200, 202, 404))
        await admin.request("DELETE", f"/api/v1/nodes/{node}", ok=(200, 202, 404))
        await admin.request("DELETE", f"/api/v1/namespaces/{ns}", ok=(200, 202, 404))
        stack.cp.unregister_webhooks(f"zz-chain-{run}")


async def test_a_limitrange_default_for_our_resources_is_judged_by_our_webhook(stack: Stack, admin: Kube) -> None:
    """LimitRanger fills defaults before any mutating webhook runs (and only checks min/max after them), so our
    webhook sees the defaulted values and judges them as the user's own."""
    run = uuid.uuid4().hex[:6]
    ns = f"e2e-chain-lr-{run}"
    await admin.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    try:
        await admin.request("POST", f"/api/v1/namespaces/{ns}/limitranges", {"metadata": {"name": "gpu"}, "spec": {
            "limits": [{"type": "Container", "default": {"mthreads.com/sgpu-core": "20"}}]}})
        body = pod("defaulted", run, [], {"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "8"})

        async def refused() -> str | None:  # the API server reads LimitRanges from an informer: a little later
            try:
                await admin.request("POST", f"/api/v1/namespaces/{ns}/pods", body, query={"dryRun": "All"})
            except KubeError as e:
                return str(e) if "sgpu-core=20" in str(e) else None
            return None

        msg = await until(refused, "the LimitRange default refused by our webhook", stack.logs, 30.0)
        assert 'admission webhook "' in msg and 'container "main": mthreads.com/sgpu-core=20 is outside 1..16' in msg
    finally:
        await admin.request("DELETE", f"/api/v1/namespaces/{ns}", ok=(200, 202, 404))


async def _set_reinvocation(admin: Kube, policy: str) -> None:
    path = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/mtsched-mutating"
    config: dict[str, Any] = await admin.request("GET", path)
    for hook in config["webhooks"]:
        hook["reinvocationPolicy"] = policy
    await admin.request("PUT", path, config)


async def test_with_if_needed_a_container_a_later_webhook_injects_is_judged_at_creation(
        stack: Stack, admin: Kube, https_server: Any) -> None:
    run = uuid.uuid4().hex[:6]
    ns = f"e2e-chain-again-{run}"
    await a_later_webhook(stack, admin, https_server, ns, run)
    pods = f"/api/v1/namespaces/{ns}/pods"
    proxy = {"name": "proxy", "image": "busybox", "resources": {"limits": {"mthreads.com/vgpu": "1",
                                                                            "mthreads.com/sgpu-memory": "4"}}}
    injected = pod("injected", run, [{"op": "add", "path": "/spec/containers/-", "value": proxy}])

    async def stored(body: dict[str, Any]) -> dict[str, Any]:
        got: dict[str, Any] = await admin.request("POST", pods, body, query={"dryRun": "All"})
        return got

    try:
        # Never (the default): the injected slice is stored without the cores our webhook would fill; the extender
        # books defaultCores for it (tests/unit/test_redteam_chain_extender.py), kube-scheduler counts none
        limits = (await stored(injected))["spec"]["containers"][1]["resources"]["limits"]
        assert "mthreads.com/sgpu-core" not in limits, limits
        await _set_reinvocation(admin, "IfNeeded")

        async def filled() -> dict[str, str] | None:  # the API server reloads webhook configurations a little later
            got = (await stored(injected))["spec"]["containers"][1]["resources"]["limits"]
            return got if "mthreads.com/sgpu-core" in got else None

        assert (await until(filled, "our webhook called again", stack.logs, 30.0))["mthreads.com/sgpu-core"] == "1"
        # and an injected container breaking a rule is refused at creation, not left Pending
        exclusive = {**proxy, "resources": {"limits": {"mthreads.com/vgpu": "1"}}}
        with pytest.raises(KubeError) as info:
            await stored(pod("refused", run, [{"op": "add", "path": "/spec/containers/-", "value": exclusive}]))
        assert info.value.status == 403 and "denied the request" in str(info.value), info.value
        assert "exclusive containers (only mthreads.com/vgpu: 1: proxy)" in str(info.value), info.value
    finally:
        await _set_reinvocation(admin, "Never")
        await admin.request("DELETE", f"/api/v1/namespaces/{ns}", ok=(200, 202, 404))
        stack.cp.unregister_webhooks(f"zz-chain-{run}")
