"""A stand-in API server on loopback for the red-team tests of the API client and the reflector: the `serve`
fixture starts one per handler and returns a real Kube client on it and the `Api` counting what it was asked.

A test module uses the fixture by importing it (`from tests.unit._api_standin import serve`, kept by `__all__`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from controller.reflector import Reflector
from shared.kube import Kube
from tests.kubeconfigs import token_kubeconfig

__all__ = ["BOOKMARK", "Api", "Handler", "empty_list", "nothing", "run_for", "running", "serve", "watches_answered"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

BOOKMARK = b'{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"9"}}}\n'  # a watch line: now at version 9


class Api:
    """A stand-in API server on loopback counting lists and watches; `handler` answers."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.lists = self.watches = self.continues = 0

    async def __call__(self, req: web.Request) -> web.StreamResponse:
        if req.query.get("watch") == "true":
            self.watches += 1
        elif req.method == "GET":
            self.lists += 1
            self.continues += "continue" in req.query
        return await self.handler(req)


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[Callable[[Handler], Awaitable[tuple[Kube, Api]]]]:
    made: list[tuple[Kube, web.AppRunner]] = []

    async def start(handler: Handler) -> tuple[Kube, Api]:
        api = Api(handler)
        async def route(req: web.Request) -> web.StreamResponse:
            return await api(req)

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", route)
        runner = web.AppRunner(app, shutdown_timeout=0.1)  # (stalled handlers are not waited for)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        kube = await Kube.create(str(token_kubeconfig(tmp_path / f"kc{len(made)}", f"http://127.0.0.1:{port}")))
        made.append((kube, runner))
        return kube, api

    yield start
    for kube, runner in made:
        await kube.close()
        await runner.shutdown()
        await runner.cleanup()


async def nothing(*_: Any) -> None:
    """A reflector's handler that does nothing (events, syncs)."""
    return None


def empty_list(_: web.Request) -> web.Response:
    """A list with no items, at resourceVersion 5."""
    return web.json_response({"metadata": {"resourceVersion": "5"}, "items": []})


def watches_answered(body: bytes) -> Handler:
    """An API server that answers every watch 200 with `body` (then ends the stream) and every list `empty_list`."""
    async def handler(req: web.Request) -> web.StreamResponse:
        if req.query.get("watch") == "true":
            return web.Response(body=body, content_type="application/json")
        return empty_list(req)
    return handler


@contextlib.asynccontextmanager
async def running(r: Reflector) -> AsyncIterator[asyncio.Task[None]]:
    """`r.run()` as a task for the block's time, cancelled after it."""
    task = asyncio.create_task(r.run())
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def run_for(r: Reflector, seconds: float) -> asyncio.Task[None]:
    """`r.run()` for `seconds`, then cancelled unless it ended: the task (cancelled: it was still running)."""
    task = asyncio.create_task(r.run())
    await asyncio.sleep(seconds)
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return task
