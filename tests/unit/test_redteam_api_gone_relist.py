"""Red team (API server misbehaving): a watch answered 410 Gone right after the list it starts from.

Behind a balancer, the list (a consistent read) may come from one API server replica and the watch from another
whose watch cache no longer holds the list's resourceVersion: every watch is answered 410 (as a status, or as an
ERROR event in a 200 stream), and the reflector listed everything again at once, with no wait: 3,666 full lists
and reconciles (`on_sync`) in 2 s, and readiness said the stream worked. Now: GONE_RELISTS re-lists at once, then
with backoff, the stream failing until a watch works.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from aiohttp import web

from controller.reflector import GONE_RELISTS, Reflector
from tests._wait import eventually
from tests.unit._api_standin import BOOKMARK, empty_list, nothing, running, serve

__all__ = ["serve"]  # the loopback stand-in API server (a fixture): the tests ask for it by name

GONE = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired", "code": 410,
        "message": "too old resource version: 5 (7)"}


@pytest.mark.parametrize("how", ["status", "event"])
async def test_a_watch_answered_410_at_once_every_time_is_not_a_tight_list_loop(serve: Any, how: str) -> None:
    async def handler(req: web.Request) -> web.Response:
        if req.query.get("watch") == "true":
            if how == "status":
                return web.json_response(GONE, status=410)
            return web.Response(body=orjson.dumps({"type": "ERROR", "object": GONE}) + b"\n",
                                content_type="application/json")
        return empty_list(req)

    kube, api = await serve(handler)
    syncs = [0]

    async def on_sync(_: Any) -> None:
        syncs[0] += 1

    r = Reflector(kube, "/api/v1/nodes", nothing, on_sync, "nodes")
    async with running(r):
        await eventually(lambda: "410" in r.problem(0.5), within=10, what="the stream failing after 410s")
        # GONE_RELISTS + 1 lists at once, then one per backoff (0.2, 0.4 s ...) (was: thousands a second)
        assert api.lists <= GONE_RELISTS + 6, api.lists
        assert syncs[0] == api.lists


async def test_a_watch_that_works_again_after_410s_is_live(serve: Any) -> None:
    gone = [True]

    async def handler(req: web.Request) -> web.Response:
        if req.query.get("watch") == "true":
            if gone[0]:
                return web.json_response(GONE, status=410)
            return web.Response(body=BOOKMARK, content_type="application/json")
        return empty_list(req)

    kube, _ = await serve(handler)
    r = Reflector(kube, "/api/v1/nodes", nothing, nothing, "nodes")
    async with running(r):
        await eventually(lambda: "410" in r.problem(0), within=10, what="failing after 410s")
        gone[0] = False
        await eventually(lambda: r.problem(0) == "" and r.resource_version == "9", within=15, what="live again")


async def test_one_410_relists_at_once_and_is_no_failure(serve: Any) -> None:
    watches = [0]

    async def handler(req: web.Request) -> web.Response:
        if req.query.get("watch") == "true":
            watches[0] += 1
            if watches[0] == 1:
                return web.json_response(GONE, status=410)
            await asyncio.sleep(30)  # open and quiet
        return empty_list(req)

    kube, api = await serve(handler)
    r = Reflector(kube, "/api/v1/nodes", nothing, nothing, "nodes")
    async with running(r):
        await eventually(lambda: watches[0] >= 2, within=10, what="the second watch")
        assert api.lists == 2 and r.problem(0) == "" and r.failing_since is None
