"""Red team (API server under pressure and misbehaving), against the real kube-apiserver through an HTTP relay on
loopback (plain HTTP) that forwards every request and, when told, changes what a watch asks or answers:

* `lagging`: a watch is sent on with `resourceVersion=1` (compacted), as a replica whose watch cache lacks the
  list's version would see it: the real API server answers 410 to every watch. The reflector listed everything
  again at once, each time (300 full lists in 30 s through the relay, readiness fine); now twice at once, then with
  backoff, the stream failing.
* `throttled`: the first watch is answered 429 with `Retry-After: 2`, as API Priority and Fairness answers; the
  reflector asked again after 0.2 s; now no sooner than asked, and it then sees the objects the real server holds.

tests/unit/test_redteam_api_gone_relist.py and test_redteam_api_retry_after.py prove the same on a stand-in.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from controller.reflector import GONE_RELISTS, Reflector
from deploy.local.controlplane import ControlPlane
from shared.kube import Kube
from tests.e2e._wait import until
from tests.kubeconfigs import token_kubeconfig

pytestmark = [pytest.mark.e2e]


class Relay:
    """Forwards to the real API server (as the admin); counts lists and watches; `mode` changes watches."""

    def __init__(self, upstream: Kube) -> None:
        self.upstream = upstream
        self.mode = ""
        self.lists: list[float] = []
        self.watches: list[float] = []

    async def __call__(self, req: web.Request) -> web.StreamResponse:
        query = dict(req.query)
        watch = query.get("watch") == "true"
        (self.watches if watch else self.lists if req.method == "GET" else []).append(time.monotonic())
        if watch and self.mode == "throttled" and len(self.watches) == 1:
            return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 429,
                                      "reason": "TooManyRequests", "message": "too many requests"},
                                     status=429, headers={"Retry-After": "2"})
        if watch and self.mode == "lagging":
            query["resourceVersion"] = "1"  # older than the watch cache holds: the real server answers 410
        body = await req.read()
        resp = await self.upstream.raw(req.method, req.path, body or None, query,
                                       timeout=aiohttp.ClientTimeout(total=None, sock_read=330, connect=10))
        async with resp:
            out = web.StreamResponse(status=resp.status,
                                     headers={"Content-Type": resp.headers.get("Content-Type", "application/json")})
            await out.prepare(req)
            async for chunk in resp.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out


@pytest_asyncio.fixture
async def relayed(control_plane_no_watch_cache: ControlPlane,
                  tmp_path: Path) -> AsyncIterator[tuple[Relay, Kube, Kube, str]]:
    """(relay, a Kube through it, the admin Kube straight to the API server, a fresh namespace). The plane without
    a watch cache: a watch from a compacted version reaches etcd, and the real server answers it 410."""
    cp = control_plane_no_watch_cache
    upstream = await Kube.create(str(cp.kubeconfig_path))
    relay = Relay(upstream)

    async def route(req: web.Request) -> web.StreamResponse:
        return await relay(req)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", route)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    through = await Kube.create(str(token_kubeconfig(tmp_path / "relay.kubeconfig", f"http://127.0.0.1:{port}")))
    ns = f"e2e-rt-api-{uuid.uuid4().hex[:6]}"
    await upstream.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    await _configmap(upstream, ns, "a")
    cp.compact_etcd()  # (the version the lagging relay asks for is compacted)
    try:
        yield relay, through, upstream, ns
    finally:
        await through.close()
        await upstream.close()
        await runner.cleanup()


async def _configmap(kube: Kube, ns: str, name: str) -> None:
    await kube.request("POST", f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": name}})


async def _nothing(*_: Any) -> None:
    return None


async def test_watches_answered_410_by_the_real_api_server_are_not_a_tight_list_loop(
        relayed: tuple[Relay, Kube, Kube, str]) -> None:
    relay, through, _, ns = relayed
    relay.mode = "lagging"
    r = Reflector(through, f"/api/v1/namespaces/{ns}/configmaps", _nothing, _nothing, "configmaps")
    task = asyncio.create_task(r.run())
    try:
        async def failing() -> bool | None:
            return True if "410" in r.problem(0.5) else None

        await until(failing, "the stream failing after watches answered 410", lambda: f"{len(relay.lists)} lists")
        # GONE_RELISTS + 1 lists at once, then one per backoff (was: a full list each time, without a wait)
        assert len(relay.lists) <= GONE_RELISTS + 6, len(relay.lists)
        relay.mode = ""  # the lagging replica caught up: the next watch works and the stream is live again

        async def live() -> bool | None:
            return True if r.problem(0) == "" else None

        await until(live, "the stream live again", lambda: r.problem(0), timeout=30)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_watch_answered_429_is_asked_again_as_retry_after_says(relayed: tuple[Relay, Kube, Kube, str]) -> None:
    relay, through, upstream, ns = relayed
    relay.mode = "throttled"
    seen: list[str] = []

    async def on_event(kind: str, obj: dict[str, Any]) -> None:
        seen.append(f"{kind} {obj['metadata']['name']}")

    r = Reflector(through, f"/api/v1/namespaces/{ns}/configmaps", on_event, _nothing, "configmaps")
    task = asyncio.create_task(r.run())
    try:
        async def asked_again() -> bool | None:
            return True if len(relay.watches) >= 2 else None

        await until(asked_again, "the watch asked again")
        assert relay.watches[1] - relay.watches[0] >= 2.0 - 0.05, relay.watches[1] - relay.watches[0]  # (was: 0.2)
        await _configmap(upstream, ns, "b")

        async def event() -> bool | None:
            return True if "ADDED b" in seen else None

        await until(event, "the real server's event through the resumed watch", lambda: str(seen))
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
