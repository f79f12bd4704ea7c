"""Red team (rt-two) of the short-watch rule (controller/reflector.py): a stream opened after a short one counted as
working only once a line of it was handled, so a healthy quiet stream (no event; bookmarks a minute or more apart)
stayed "failing": readiness false after 10 s, the reconciler (views_live) and the janitor held, until its first line."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from controller.reflector import SHORT_WATCH_S, Reflector
from tests.unit._api_standin import empty_list, nothing, running, serve

__all__ = ["serve"]  # the loopback stand-in API server (a fixture): the tests ask for it by name


async def test_a_quiet_stream_after_a_short_one_is_not_failing(serve: Any) -> None:
    """One stream ends at once (an API server restarting); the next is healthy and quiet (no event, no bookmark
    yet: they come a minute or more apart). It must count as working once it has stayed open SHORT_WATCH_S."""
    watches = 0

    async def handler(req: web.Request) -> web.StreamResponse:
        nonlocal watches
        if req.query.get("watch") == "true":
            watches += 1
            if watches == 1:
                return web.Response(body=b"", content_type="application/json")  # 200, ends at once
            resp = web.StreamResponse()
            resp.content_type = "application/json"
            await resp.prepare(req)
            await asyncio.sleep(3600)  # open and quiet
            return resp
        return empty_list(req)

    kube, _ = await serve(handler)
    r = Reflector(kube, "/api/v1/nodes", nothing, nothing, "nodes")
    async with running(r):
        await asyncio.sleep(0.2 + SHORT_WATCH_S + 1.5)  # the backoff after the short stream, then > 1 s open
        assert watches == 2
        assert r.problem(0) == "", r.problem(0)
