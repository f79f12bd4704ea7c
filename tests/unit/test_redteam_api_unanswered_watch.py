"""Red team (API server misbehaving): a watch request that is accepted and never answered.

An API server replica whose process is frozen (or wedged) behind a balancer still has its connections accepted by
the kernel; a watch resumed there waited for its answer for the stream's read timeout, 330 s, with readiness fine
and the view counted live (the janitor and the reconciler trust it) while other replicas took Bindings and
deletions. Now the wait for a watch's answer is bounded (WATCH_OPEN_S), and unanswered for 10 s the stream counts
as failing.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web

import controller.reflector as reflector_module
from controller.reflector import Reflector
from tests._wait import eventually
from tests.unit._api_standin import BOOKMARK, empty_list, nothing, running, serve

__all__ = ["serve"]  # the loopback stand-in API server (a fixture): the tests ask for it by name

def frozen_after_first_watch(watches: list[int]) -> Any:
    async def handler(req: web.Request) -> web.StreamResponse:
        if req.query.get("watch") == "true":
            watches[0] += 1
            if watches[0] > 1:
                await asyncio.sleep(60)  # accepted, never answered
            return web.Response(body=BOOKMARK, content_type="application/json")  # a stream that ends: resumed
        return empty_list(req)
    return handler


async def test_a_watch_never_answered_makes_the_stream_failing(serve: Any) -> None:
    watches = [0]
    kube, _ = await serve(frozen_after_first_watch(watches))
    r = Reflector(kube, "/api/v1/nodes", nothing, nothing, "nodes")
    async with running(r):
        await eventually(lambda: watches[0] >= 2, within=10, what="the resumed watch")
        # (was: "" for the read timeout's 330 s, the view counted live)
        await eventually(lambda: "not answered" in r.problem(1.0), within=10, what="the stream failing")
        assert "not answered" in r.unsettled(10.0)  # the janitor does not trust the view meanwhile


async def test_a_watch_never_answered_is_abandoned_and_asked_again(serve: Any,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reflector_module, "WATCH_OPEN_S", 0.5)
    watches = [0]
    kube, _ = await serve(frozen_after_first_watch(watches))
    r = Reflector(kube, "/api/v1/nodes", nothing, nothing, "nodes")
    async with running(r):
        await eventually(lambda: watches[0] >= 4, within=15, what="unanswered watches asked again")
        assert r.failing_since is not None and "not answered within" in r.last_error
        assert "stream failing" in r.problem(0.5) or "not answered" in r.problem(0.5)
