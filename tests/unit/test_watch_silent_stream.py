"""A watch stream that opened, then fell silent without ending: an API server replica frozen after answering (its
kernel still acknowledges TCP keepalives, so keepalive cannot tell). The server ends every watch within the
timeoutSeconds the reflector asks (WATCH_SECONDS), a bookmark first; so a stream silent for longer than any of them
lasts (WATCH_READ_S) was ended by nobody, and the reflector abandons and resumes it then (was: 330 s)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web

import controller.reflector as reflector_module
from controller.reflector import WATCH_READ_S, WATCH_SECONDS, Reflector
from tests._wait import eventually
from tests.unit._api_standin import BOOKMARK, empty_list, nothing, running, serve

__all__ = ["serve"]  # the loopback stand-in API server (a fixture): the tests ask for it by name


def test_a_stream_is_read_longer_than_the_server_may_keep_it_quiet() -> None:
    # a live stream is silent at most until the server ends it (its bookmark comes then): never cut as stalled
    assert WATCH_SECONDS[0] <= WATCH_SECONDS[1] < WATCH_READ_S
    assert WATCH_READ_S <= 120  # the documented bound (docs/runbooks.md) for a stream stalled on a frozen server


def silent_after_a_bookmark(watches: list[int], asked: list[int]) -> Any:
    async def handler(req: web.Request) -> web.StreamResponse:
        if req.query.get("watch") != "true":
            return empty_list(req)
        watches[0] += 1
        asked.append(int(req.query["timeoutSeconds"]))
        out = web.StreamResponse(headers={"Content-Type": "application/json"})
        await out.prepare(req)
        await out.write(BOOKMARK)
        if watches[0] == 1:
            await asyncio.sleep(60)  # open and silent: nobody ends it (the test ends well before)
        return out  # later streams end at once after their bookmark: resumed as usual
    return handler


async def test_a_silent_stream_is_abandoned_and_resumed(serve: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reflector_module, "WATCH_READ_S", 0.5)
    watches: list[int] = [0]
    asked: list[int] = []
    kube, api = await serve(silent_after_a_bookmark(watches, asked))
    r = Reflector(kube, "/api/v1/nodes", nothing, nothing, "nodes")
    async with running(r):
        await eventually(lambda: watches[0] >= 2, within=15, what="the silent stream abandoned and resumed")
        assert r.resource_version == "9" and api.lists == 1  # resumed from the bookmark's version, not listed again
    assert all(WATCH_SECONDS[0] <= t <= WATCH_SECONDS[1] for t in asked), asked
