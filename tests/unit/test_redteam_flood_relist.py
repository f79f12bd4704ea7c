"""Red team (floods): a watch answered 410 Gone at once, every time, re-listed with no wait.

client-go paces its ListAndWatch with a backoff; our reflector reset its backoff after each list and, on Gone,
listed again at once: an API server (or a proxy in front of it) that answers every watch 410, as a watch cache
that stays behind the storage does, got a full LIST of every pod of the cluster in a tight loop.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from controller.reflector import Reflector
from tests.unit._api_standin import BOOKMARK, empty_list, nothing, run_for, running, serve, watches_answered

__all__ = ["serve"]  # the loopback stand-in API server (a fixture): the tests ask for it by name


async def test_a_watch_answered_410_every_time_is_not_a_tight_relist_loop(serve: Any) -> None:
    async def handler(req: web.Request) -> web.Response:
        if req.query.get("watch") == "true":
            return web.json_response({"kind": "Status", "code": 410, "reason": "Expired"}, status=410)
        return empty_list(req)

    kube, api = await serve(handler)
    r = Reflector(kube, "/api/v1/pods", nothing, nothing, "pods")
    task = await run_for(r, 2.0)
    assert task.cancelled()  # still running
    assert api.lists <= 8, api.lists  # 0.2 + 0.4 + 0.8 s of backoff, a first re-list at once


async def test_a_watch_whose_first_event_is_410_every_time_is_not_a_tight_relist_loop(serve: Any) -> None:
    gone = b'{"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired"}}\n'
    kube, api = await serve(watches_answered(gone))
    r = Reflector(kube, "/api/v1/pods", nothing, nothing, "pods")
    await run_for(r, 2.0)
    assert api.lists <= 8, api.lists


async def test_a_410_after_the_watch_moved_on_relists_at_once(serve: Any, caplog: Any) -> None:
    """The ordinary case (its version compacted away after events): no wait, no warning."""
    caplog.set_level(logging.INFO, "mtsched.reflector")
    relisted = asyncio.Event()

    async def handler(req: web.Request) -> web.Response:
        if req.query.get("watch") == "true":
            if req.query.get("resourceVersion") == "5":  # a bookmark moves the stream on, then it ends
                return web.Response(body=BOOKMARK, content_type="application/json")
            return web.json_response({"kind": "Status", "code": 410}, status=410)
        if api.lists >= 2:
            relisted.set()
        return empty_list(req)

    kube, api = await serve(handler)
    r = Reflector(kube, "/api/v1/pods", nothing, nothing, "pods")
    async with running(r):
        await asyncio.wait_for(relisted.wait(), 10)
    assert "expired (410): re-listing" in caplog.text and "before any event" not in caplog.text


async def test_a_handler_that_keeps_failing_does_not_reopen_the_watch_in_a_tight_loop(serve: Any) -> None:
    """Redis down: the first event of each resumed stream cannot be handled (replayed on the next). Each stream
    opened 200 reset the backoff, so the watch was opened again every 0.2 s, each time sent every event since
    the last handled version, for as long as Redis was away."""
    event = b'{"type":"ADDED","object":{"metadata":{"name":"p","uid":"u","resourceVersion":"6"}}}\n'

    async def redis_down(kind: str, obj: dict[str, Any]) -> None:
        raise ConnectionError("Redis is away")

    kube, api = await serve(watches_answered(event))
    r = Reflector(kube, "/api/v1/pods", redis_down, nothing, "pods")
    task = await run_for(r, 3.0)
    assert task.cancelled()  # still running
    assert api.watches <= 6, api.watches  # 0.2 + 0.4 + 0.8 + 1.6 s of backoff (was: one every 0.2 s)
    assert r.resource_version == "5" and "Redis is away" in r.problem(0)  # replayed, not skipped


async def test_the_backoff_of_streams_that_end_at_once_keeps_growing(serve: Any, caplog: Any) -> None:
    """A stream opened after a short one counts as working once held open 1 s; its timer was left running through
    the backoff slept after it ended, so from the 1.6 s wait on the backoff started over at 0.2 s (and the stream
    was said to work) instead of growing to its 10 s."""
    caplog.set_level(logging.WARNING, "mtsched.reflector")

    kube, _ = await serve(watches_answered(b""))  # 200, ends at once
    r = Reflector(kube, "/api/v1/nodes", nothing, nothing, "nodes")
    await run_for(r, 4.5)
    waits = [float(m.rsplit(" in ", 1)[1].rstrip("s")) for m in caplog.messages if "resuming from" in m]
    assert len(waits) >= 5 and waits == sorted(waits), waits
    assert "stream failing" in r.problem(1.5)
