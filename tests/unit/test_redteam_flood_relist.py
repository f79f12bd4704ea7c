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
from tests.unit.test_redteam_api_pressure import _empty_list, _nothing, _run_for, serve

__all__ = ["serve"]


async def test_a_watch_answered_410_every_time_is_not_a_tight_relist_loop(serve: Any) -> None:
    async def handler(req: web.Request) -> web.Response:
        if req.query.get("watch") == "true":
            return web.json_response({"kind": "Status", "code": 410, "reason": "Expired"}, status=410)
        return _empty_list(req)

    kube, api = await serve(handler)
    r = Reflector(kube, "/api/v1/pods", _nothing, _nothing, "pods")
    task = await _run_for(r, 2.0)
    assert task.cancelled()  # still running
    assert api.lists <= 8, api.lists  # 0.2 + 0.4 + 0.8 s of backoff, a first re-list at once


async def test_a_watch_whose_first_event_is_410_every_time_is_not_a_tight_relist_loop(serve: Any) -> None:
    gone = b'{"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired"}}\n'

    async def handler(req: web.Request) -> web.Response:
        if req.query.get("watch") == "true":
            return web.Response(body=gone, content_type="application/json")
        return _empty_list(req)

    kube, api = await serve(handler)
    r = Reflector(kube, "/api/v1/pods", _nothing, _nothing, "pods")
    await _run_for(r, 2.0)
    assert api.lists <= 8, api.lists


async def test_a_410_after_the_watch_moved_on_relists_at_once(serve: Any, caplog: Any) -> None:
    """The ordinary case (its version compacted away after events): no wait, no warning."""
    caplog.set_level(logging.INFO, "mtsched.reflector")
    relisted = asyncio.Event()

    async def handler(req: web.Request) -> web.Response:
        if req.query.get("watch") == "true":
            if req.query.get("resourceVersion") == "5":  # a bookmark moves the stream on, then it ends
                return web.Response(body=b'{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"9"}}}\n',
                                    content_type="application/json")
            return web.json_response({"kind": "Status", "code": 410}, status=410)
        if api.lists >= 2:
            relisted.set()
        return _empty_list(req)

    kube, api = await serve(handler)
    r = Reflector(kube, "/api/v1/pods", _nothing, _nothing, "pods")
    task = asyncio.create_task(r.run())
    try:
        await asyncio.wait_for(relisted.wait(), 10)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert "expired (410): re-listing" in caplog.text and "before any event" not in caplog.text
