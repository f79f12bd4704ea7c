"""Smoke tests of the local control plane itself: nodes, scheduler + extender, webhooks, watches."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from deploy.local.controlplane import ControlPlane, ExtenderSpec
from deploy.local.nodes import (
    S4000_MEMORY_UNITS,
    S5000_MEMORY_UNITS,
    create_nodes,
    delete_nodes,
    gpu_node,
    set_capacity,
)
from tests.e2e._wait import until_true

pytestmark = pytest.mark.e2e

Json = dict[str, Any]


def _pod(name: str, scheduler: str = "default-scheduler", **extra: Any) -> Any:
    """A minimal pod body (Any: the client accepts dicts where its hints say V1Pod)."""
    container: Json = {"name": "main", "image": "registry.invalid/none:0"}
    if "limits" in extra:
        container["resources"] = {"limits": extra.pop("limits")}
    spec: Json = {"schedulerName": scheduler, "containers": [container], **extra.pop("spec", {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, **extra}, "spec": spec}



# --------------------------------------------------------------------------------------- (a) nodes
async def test_simulated_nodes_capacity(
    api_client: client.ApiClient, name_factory: Callable[[str], str]
) -> None:
    core = client.CoreV1Api(api_client)
    n4, n5 = name_factory("s4000"), name_factory("s5000")
    group = name_factory("grp")
    try:
        await create_nodes(
            api_client,
            [
                gpu_node(n4, S4000_MEMORY_UNITS, sliced_cards=8, labels={"mtsched.io/test-group": group}),
                gpu_node(
                    n5,
                    S5000_MEMORY_UNITS,
                    sliced_cards=2,
                    whole_cards=2,
                    card_ids=[5, 7],
                    labels={"mtsched.io/test-group": group},
                ),
            ],
        )
        nodes = {
            n.metadata.name: n
            for n in (await core.list_node(label_selector=f"mtsched.io/test-group={group}")).items
        }
        assert set(nodes) == {n4, n5}

        a4 = nodes[n4].status.allocatable
        assert a4["mthreads.com/sgpu-core"] == "128" and a4["mthreads.com/sgpu-memory"] == "768"
        assert "mthreads.com/gpu" not in a4 and a4["pods"] == "110"
        assert nodes[n4].metadata.labels["mthreads.com/sgpu.cores"] == "0-1-2-3-4-5-6-7"
        assert nodes[n4].metadata.labels["mthreads.com/gpu-node"] == "true"
        # TaintNodesByCondition is disabled: no not-ready taint without a kubelet.
        assert not nodes[n4].spec.taints

        c5 = nodes[n5].status.capacity
        assert c5["mthreads.com/sgpu-core"] == "32" and c5["mthreads.com/sgpu-memory"] == "320"
        assert c5["mthreads.com/gpu"] == "2"
        assert nodes[n5].metadata.labels["mthreads.com/sgpu.cores"] == "5-7"
        assert nodes[n5].metadata.labels["mthreads.com/gpu.count"] == "4"

        # Capacity changes go through /status; a None removes the resource.
        await set_capacity(api_client, n5, {"mthreads.com/sgpu-memory": 160, "mthreads.com/gpu": None})
        got = (await core.read_node(n5)).status
        assert got.capacity["mthreads.com/sgpu-memory"] == "160"
        assert got.allocatable["mthreads.com/sgpu-memory"] == "160"
        assert "mthreads.com/gpu" not in got.allocatable
        assert got.allocatable["mthreads.com/sgpu-core"] == "32"  # untouched keys stay
    finally:
        await delete_nodes(api_client, [n4, n5])


# ------------------------------------------------------------------------ (b) scheduler + extender
async def test_scheduler_binds_through_extender(
    control_plane: ControlPlane,
    api_client: client.ApiClient,
    namespace: str,
    name_factory: Callable[[str], str],
    https_server: Callable[[web.Application], Any],
) -> None:
    core = client.CoreV1Api(api_client)
    calls: dict[str, list[Json]] = {"filter": [], "prioritize": [], "bind": []}
    n1, n2 = name_factory("ext-a"), name_factory("ext-b")
    group = name_factory("grp")

    async def filter_(request: web.Request) -> web.Response:
        args = await request.json()
        calls["filter"].append(args)
        return web.json_response({"NodeNames": args["NodeNames"], "FailedNodes": {}, "Error": ""})

    async def prioritize(request: web.Request) -> web.Response:
        args = await request.json()
        calls["prioritize"].append(args)
        return web.json_response([{"Host": n, "Score": 10 if n == n2 else 0} for n in args["NodeNames"]])

    async def bind(request: web.Request) -> web.Response:
        args = await request.json()
        calls["bind"].append(args)
        binding: Any = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": args["PodName"], "uid": args["PodUID"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": args["Node"]},
        }
        # _preload_content=False: the reply is a Status that V1Binding cannot deserialise.
        resp: Any = await core.create_namespaced_pod_binding(
            args["PodName"], args["PodNamespace"], binding, _preload_content=False
        )
        resp.release()
        return web.json_response({"Error": ""})

    app = web.Application()
    app.router.add_post("/filter", filter_)
    app.router.add_post("/prioritize", prioritize)
    app.router.add_post("/bind", bind)
    url = await https_server(app)

    labels = {"mtsched.io/test-group": group}
    await create_nodes(api_client, [gpu_node(n1, S4000_MEMORY_UNITS, labels=labels),
                                    gpu_node(n2, S5000_MEMORY_UNITS, labels=labels)])
    await control_plane.start_scheduler_async(ExtenderSpec(url))
    try:
        sel = {"nodeSelector": {"mtsched.io/test-group": group}}
        await core.create_namespaced_pod(
            namespace, _pod("gpu", "hami-scheduler", limits={"mthreads.com/vgpu": "1"}, spec=sel)
        )
        # Extenders are global (all profiles): a default-scheduler pod asking for vgpu goes there too.
        await core.create_namespaced_pod(
            namespace, _pod("gpu-default", limits={"mthreads.com/vgpu": "1"}, spec=sel)
        )
        # No managed resource: the scheduler never asks the extender about this one.
        await core.create_namespaced_pod(namespace, _pod("plain", spec=sel))

        async def bound(name: str) -> str | None:
            node: str | None = (await core.read_namespaced_pod(name, namespace)).spec.node_name
            return node

        assert await until_true(lambda: bound("gpu"), "gpu pod bound") == n2
        assert await until_true(lambda: bound("gpu-default"), "gpu-default pod bound") == n2
        assert await until_true(lambda: bound("plain"), "plain pod bound") in (n1, n2)

        # (pods of other tests on the shared control plane that still wait are asked about too: this namespace's)
        assert sorted(b["PodName"] for b in calls["bind"] if b["PodNamespace"] == namespace) == ["gpu", "gpu-default"]
        assert {c["Pod"]["metadata"]["name"] for c in calls["filter"]
                if c["Pod"]["metadata"]["namespace"] == namespace} == {"gpu", "gpu-default"}
        f = next(c for c in calls["filter"] if c["Pod"]["metadata"]["name"] == "gpu")
        # nodeCacheCapable: names only, Nodes is null; Go field names (no JSON tags).
        assert set(f) >= {"Pod", "Nodes", "NodeNames"} and f["Nodes"] is None
        assert sorted(f["NodeNames"]) == sorted([n1, n2])
        assert f["Pod"]["metadata"]["name"] == "gpu"
        assert calls["prioritize"] and sorted(calls["prioritize"][0]["NodeNames"]) == sorted([n1, n2])
        b = next(c for c in calls["bind"] if c["PodName"] == "gpu")
        assert set(b) == {"PodName", "PodNamespace", "PodUID", "Node"}
        assert (b["PodNamespace"], b["Node"]) == (namespace, n2)
        assert b["PodUID"] == (await core.read_namespaced_pod("gpu", namespace)).metadata.uid
    finally:
        await asyncio.to_thread(control_plane.stop_scheduler)
        await delete_nodes(api_client, [n1, n2])


# ---------------------------------------------------------------------------------- (c) webhooks
async def test_mutating_and_validating_webhook(
    control_plane: ControlPlane,
    api_client: client.ApiClient,
    namespace: str,
    https_server: Callable[[web.Application], Any],
) -> None:
    core = client.CoreV1Api(api_client)
    seen: list[Json] = []

    async def mutate(request: web.Request) -> web.Response:
        review = await request.json()
        req = review["request"]
        seen.append(req)
        pod = req["object"]
        patch: list[Json]
        if pod["metadata"].get("labels"):
            patch = [{"op": "add", "path": "/metadata/labels/mtsched.io~1mutated", "value": "yes"}]
        else:
            patch = [{"op": "add", "path": "/metadata/labels", "value": {"mtsched.io/mutated": "yes"}}]
        return web.json_response(
            {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {
                    "uid": req["uid"],
                    "allowed": True,
                    "patchType": "JSONPatch",
                    "patch": base64.b64encode(json.dumps(patch).encode()).decode(),
                },
            }
        )

    async def validate(request: web.Request) -> web.Response:
        req = (await request.json())["request"]
        deny = req["object"]["metadata"].get("labels", {}).get("deny") == "true"
        response: Json = {"uid": req["uid"], "allowed": not deny}
        if deny:
            response["status"] = {"code": 403, "message": "denied by test"}
        return web.json_response(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
        )

    app = web.Application()
    app.router.add_post("/mutate", mutate)
    app.router.add_post("/validate", validate)
    url = await https_server(app)

    name = f"smoke-{namespace}"
    t0 = time.monotonic()
    await control_plane.register_webhooks_async(
        f"{url}/mutate",
        f"{url}/validate",
        name=name,
        namespace_selector={"matchLabels": {"kubernetes.io/metadata.name": namespace}},
    )
    print(f"webhook configs live after {time.monotonic() - t0:.2f}s")
    try:
        created = await core.create_namespaced_pod(namespace, _pod("p1"))
        assert created.metadata.labels == {"mtsched.io/mutated": "yes"}
        created = await core.create_namespaced_pod(namespace, _pod("p2", labels={"app": "x"}))
        assert created.metadata.labels == {"app": "x", "mtsched.io/mutated": "yes"}
        real = [r for r in seen if not r.get("dryRun")]
        assert [r["object"]["metadata"]["name"] for r in real] == ["p1", "p2"]
        assert real[0]["operation"] == "CREATE" and real[0]["namespace"] == namespace

        with pytest.raises(ApiException) as exc:
            await core.create_namespaced_pod(namespace, _pod("p3", labels={"deny": "true"}))
        assert exc.value.status == 403 and "denied by test" in str(exc.value.body)

        # The canary entries are gone again: only the real webhooks remain.
        reg = client.AdmissionregistrationV1Api(api_client)
        mwc = await reg.read_mutating_webhook_configuration(f"{name}-mutating")
        assert [w.name for w in mwc.webhooks] == [f"pods.mutating.{name}.mtsched.io"]
    finally:
        await asyncio.to_thread(control_plane.unregister_webhooks, name)


# ------------------------------------------------------------------------------------ (d) watches
async def _collect(
    api: client.ApiClient, namespace: str, resource_version: str, count: int, quiet: float = 1.0
) -> list[tuple[str, str, str]]:
    """(type, name, rv) of watch events from ``resource_version``: ``count`` events, then ``quiet``
    seconds without more (to prove nothing else arrives)."""
    core = client.CoreV1Api(api)
    w = watch.Watch()
    events: list[tuple[str, str, str]] = []
    stream = w.stream(core.list_namespaced_pod, namespace, resource_version=resource_version)
    try:
        while True:
            wait = 15.0 if len(events) < count else quiet
            try:
                ev = await asyncio.wait_for(stream.__anext__(), wait)
            except TimeoutError:
                if len(events) < count:
                    raise AssertionError(f"only {events} within {wait}s") from None
                return events
            meta = ev["raw_object"]["metadata"]
            events.append((ev["type"], meta["name"], meta["resourceVersion"]))
    finally:
        await w.close()


async def test_watch_resume_from_resource_version(api_client: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(api_client)
    rv0 = (await core.list_namespaced_pod(namespace)).metadata.resource_version
    p1 = await core.create_namespaced_pod(namespace, _pod("w1"))
    assert await _collect(api_client, namespace, rv0, 1) == [("ADDED", "w1", p1.metadata.resource_version)]

    p1m = await core.patch_namespaced_pod("w1", namespace, {"metadata": {"labels": {"step": "2"}}})
    p2 = await core.create_namespaced_pod(namespace, _pod("w2"))
    evs = await _collect(api_client, namespace, rv0, 3)
    assert evs == [
        ("ADDED", "w1", p1.metadata.resource_version),
        ("MODIFIED", "w1", p1m.metadata.resource_version),
        ("ADDED", "w2", p2.metadata.resource_version),
    ]
    # Reconnect from the middle RV: only what happened after it.
    assert await _collect(api_client, namespace, p1m.metadata.resource_version, 1) == [
        ("ADDED", "w2", p2.metadata.resource_version)
    ]


async def _make_history(core: client.CoreV1Api, namespace: str) -> tuple[str, str]:
    """A pod and two later changes; returns (rv right after create, rv of the last change)."""
    p = await core.create_namespaced_pod(namespace, _pod("h1"))
    await core.patch_namespaced_pod("h1", namespace, {"metadata": {"labels": {"step": "1"}}})
    last = await core.patch_namespaced_pod("h1", namespace, {"metadata": {"labels": {"step": "2"}}})
    return p.metadata.resource_version, last.metadata.resource_version


async def test_watch_410_after_etcd_compaction(
    control_plane_no_watch_cache: ControlPlane,
    api_client_no_watch_cache: client.ApiClient,
    namespace_factory: Callable[[client.ApiClient], Any],
) -> None:
    cp, api = control_plane_no_watch_cache, api_client_no_watch_cache
    namespace = await namespace_factory(api)
    core = client.CoreV1Api(api)
    old_rv, last_rv = await _make_history(core, namespace)
    # Before compaction the old RV is fine and replays the two patches.
    assert [e[0] for e in await _collect(api, namespace, old_rv, 2, quiet=0.3)] == ["MODIFIED", "MODIFIED"]

    rev = cp.compact_etcd()
    assert rev >= int(last_rv)

    # Raw request: the apiserver answers 200 and then a single ERROR event carrying a 410 Status.
    resp: Any = await core.list_namespaced_pod(
        namespace, watch=True, resource_version=old_rv, _preload_content=False
    )
    try:
        line = await asyncio.wait_for(resp.content.readline(), 10)
    finally:
        resp.release()
    assert resp.status == 200
    event = json.loads(line)
    assert event["type"] == "ERROR" and event["object"]["code"] == 410, event
    assert event["object"]["reason"] == "Expired"

    # kubernetes_asyncio turns it into ApiException(410) (after one silent retry with the same RV).
    with pytest.raises(ApiException) as exc:
        await _collect(api, namespace, old_rv, 1)
    assert exc.value.status == 410

    # The recovery a controller must do: re-list, then watch from the fresh list RV.
    rv = (await core.list_namespaced_pod(namespace)).metadata.resource_version
    await core.patch_namespaced_pod("h1", namespace, {"metadata": {"labels": {"step": "3"}}})
    assert [e[:2] for e in await _collect(api, namespace, rv, 1)] == [("MODIFIED", "h1")]


async def test_watch_cache_serves_old_rv_after_compaction(
    control_plane: ControlPlane, api_client: client.ApiClient, namespace: str
) -> None:
    """With the watch cache on (the default, as in real clusters), etcd compaction alone does not
    cause 410 for RVs inside the cache window: the watch is served from apiserver memory."""
    core = client.CoreV1Api(api_client)
    old_rv, _ = await _make_history(core, namespace)
    control_plane.compact_etcd()
    assert [e[0] for e in await _collect(api_client, namespace, old_rv, 2, quiet=0.3)] == [
        "MODIFIED",
        "MODIFIED",
    ]


# ------------------------------------------------------------------------- (f) a Binding's deadline


def test_the_api_server_never_writes_a_binding_past_its_deadline(control_plane: ControlPlane) -> None:
    """What the watchers' keep window rests on (shared/domain/timing.py): the extender sends each Binding with
    the API server's `timeout` parameter, which the API server enforces. Shown here for a deadline that has
    passed on arrival: 504, and the pod stays unbound, without the Binding's annotation (a write cut off in
    etcd by the deadline is not something this harness can make happen)."""
    cp = control_plane
    ns = "default"
    for name, timeout, written in (("deadline-past", "1ns", False), ("deadline-ok", "5000ms", True)):
        cp.api("POST", f"/api/v1/namespaces/{ns}/pods", _pod(name, scheduler="nobody"))
        try:
            status, raw = cp._http("POST", f"/api/v1/namespaces/{ns}/pods/{name}/binding?timeout={timeout}", {
                "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, "annotations": {"probe": timeout}},
                "target": {"apiVersion": "v1", "kind": "Node", "name": "deadline-node"}})
            pod = cp.api("GET", f"/api/v1/namespaces/{ns}/pods/{name}")
            assert status == (201 if written else 504), raw
            assert (pod["spec"].get("nodeName") == "deadline-node") is written, pod["spec"]
            assert ("probe" in (pod["metadata"].get("annotations") or {})) is written
        finally:
            cp._http("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}?gracePeriodSeconds=0")
