"""Kube.raw sends each call on the API client's session itself (shared/kube.py): what reaches the API server
is what kubernetes-asyncio's call_api sent (method, path, query, JSON body, content type, user agent, the
ServiceAccount token as the configuration gives it at each call). Real HTTP on loopback."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from shared.kube import Kube, KubeError, NotSent
from tests.kubeconfigs import token_kubeconfig
from tests.unit.test_kube_env import _serve


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[tuple[Kube, list[dict[str, Any]]]]:
    seen: list[dict[str, Any]] = []

    async def handler(req: web.Request) -> web.Response:
        body = await req.read()
        seen.append({"method": req.method, "path": req.path, "query": dict(req.query), "body": body,
                     "content_type": req.headers.get("Content-Type"), "auth": req.headers.get("Authorization"),
                     "accept": req.headers.get("Accept"), "agent": req.headers.get("User-Agent", "")})
        if req.path.endswith("/redirected/binding"):
            raise web.HTTPTemporaryRedirect("/api/v1/namespaces/ns/pods/elsewhere/binding")
        if req.path.endswith("/missing"):
            return web.json_response({"kind": "Status", "message": "pods \"missing\" not found"}, status=404)
        return web.json_response({"ok": True}, status=201 if req.method == "POST" else 200)

    runner, port = await _serve(handler)
    kube = await Kube.create(str(token_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{port}")))
    yield kube, seen
    await kube.close()
    await runner.cleanup()


async def test_a_binding_reaches_the_api_server_as_json_with_the_token(
        api: tuple[Kube, list[dict[str, Any]]]) -> None:
    kube, seen = api
    await kube.bind("ns", "p1", "uid-1", "node-a", {"hami.io/vgpu-devices-allocated": "GPU-0,mthreads,8,2:;",
                                                     "note": "ünïcode"})
    (req,) = seen
    assert (req["method"], req["path"], req["content_type"], req["accept"]) == (
        "POST", "/api/v1/namespaces/ns/pods/p1/binding", "application/json", "application/json")
    assert req["auth"] and req["auth"].startswith("Bearer ")
    assert req["agent"].startswith("OpenAPI-Generator/")  # kubernetes-asyncio's user agent, as before
    assert orjson.loads(req["body"]) == {
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": "p1", "namespace": "ns", "uid": "uid-1",
                     "annotations": {"hami.io/vgpu-devices-allocated": "GPU-0,mthreads,8,2:;", "note": "ünïcode"}},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "node-a"}}


async def test_a_binding_with_a_deadline_asks_the_api_server_to_abandon_it_then(
        api: tuple[Kube, list[dict[str, Any]]]) -> None:
    """`until`: what is left goes to getting a connection (at most BIND_CONNECT_S) and to the API server's own
    deadline (its `timeout` parameter), so the server commits the Binding by `until` or never
    (shared/domain/timing.py). Too little left: not sent at all."""
    kube, seen = api
    t0 = time.monotonic()
    await kube.bind("ns", "p1", "uid-1", "node-a", {}, until=t0 + 4.5)
    await kube.bind("ns", "p2", "uid-2", "node-a", {}, until=time.monotonic() + 1.0)
    with pytest.raises(NotSent):
        await kube.bind("ns", "p3", "uid-3", "node-a", {}, until=time.monotonic() + 0.1)
    await kube.bind("ns", "p4", "uid-4", "node-a", {})
    with pytest.raises(KubeError) as e:  # a redirected Binding would go again without its deadline: not followed
        await kube.bind("ns", "redirected", "uid-5", "node-a", {}, until=time.monotonic() + 4.5)
    assert e.value.status == 307 and seen.pop()["path"].endswith("/redirected/binding")
    long, short, plain = (r["query"] for r in seen)
    assert 3400 <= int(long["timeout"].removesuffix("ms")) <= 3500  # 4.5 s, less 1 s to get a connection
    assert 400 <= int(short["timeout"].removesuffix("ms")) <= 500  # 1 s, half of it to get a connection
    assert plain == {} and [r["path"].rsplit("/", 2)[1] for r in seen] == ["p1", "p2", "p4"]


async def test_a_binding_that_waits_for_a_connection_past_its_share_is_never_sent(tmp_path: Path) -> None:
    """Red team: the pool was full (a burst's binds, events and reads share it). Counted from the API server's
    receipt, a deadline worked out before that wait let a Binding be committed long after `until`. Now the
    wait has its own share of what is left: past it the request is not sent, and the server never sees it."""
    received: list[str] = []
    holding = asyncio.Event()

    async def handler(req: web.Request) -> web.Response:
        received.append(req.path)
        holding.set()
        if req.path == "/slow":  # another call holding the only connection
            await asyncio.sleep(2.0)
        return web.json_response({}, status=201 if req.method == "POST" else 200)

    runner, port = await _serve(handler)
    kube = await Kube.create(str(token_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{port}")))
    kube.api.rest_client.pool_manager.connector._limit = 1  # stands for the pool, full in a burst
    try:
        busy = asyncio.create_task(kube.request("GET", "/slow"))
        await asyncio.wait_for(holding.wait(), 5)
        t0 = time.monotonic()
        with pytest.raises(aiohttp.ConnectionTimeoutError):
            await kube.bind("ns", "p", "u", "n", {}, until=t0 + 1.0)
        # gave up within its share, not when the connection came free: the call holding it is still on (2 s)
        assert not busy.done()
        await busy
        assert received == ["/slow"]  # the Binding never reached the API server
    finally:
        await kube.close()
        await runner.cleanup()


async def test_query_content_type_and_errors(api: tuple[Kube, list[dict[str, Any]]]) -> None:
    kube, seen = api
    await kube.request("PATCH", "/api/v1/nodes/n1", {"metadata": {"annotations": {"a": "b"}}},
                       query={"fieldManager": "mtsched", "dryRun": "All"},
                       content_type="application/merge-patch+json")
    with pytest.raises(KubeError) as e:
        await kube.get_pod("ns", "missing")
    assert e.value.status == 404 and "not found" in str(e.value)
    patch, get = seen
    assert patch["query"] == {"fieldManager": "mtsched", "dryRun": "All"}
    assert patch["content_type"] == "application/merge-patch+json"
    assert orjson.loads(patch["body"]) == {"metadata": {"annotations": {"a": "b"}}}
    assert get["method"] == "GET" and get["body"] == b""


async def test_the_token_is_asked_of_the_configuration_at_each_call(api: tuple[Kube, list[dict[str, Any]]]) -> None:
    """A ServiceAccount token rotates: kubernetes-asyncio's in-cluster configuration re-reads it through
    refresh_api_key_hook, which must keep running before every request."""
    kube, seen = api
    calls = []

    def refresh(cfg: Any) -> None:
        calls.append(1)
        cfg.api_key["BearerToken"] = f"token-{len(calls)}"
        cfg.api_key_prefix["BearerToken"] = "Bearer"

    kube.api.configuration.refresh_api_key_hook = refresh
    await kube.request("GET", "/api/v1/nodes/a")
    await kube.request("GET", "/api/v1/nodes/b")
    assert [r["auth"] for r in seen] == ["Bearer token-1", "Bearer token-2"]


async def test_timeouts_in_each_form(api: tuple[Kube, list[dict[str, Any]]]) -> None:
    kube, seen = api
    for timeout in (5.0, None, aiohttp.ClientTimeout(total=None, sock_read=30, connect=5)):
        resp = await kube.raw("GET", "/api/v1/pods", query={"watch": "true"}, timeout=timeout)
        async with resp:
            assert resp.status == 200
    assert [r["query"] for r in seen] == [{"watch": "true"}] * 3
