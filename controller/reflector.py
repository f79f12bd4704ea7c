"""List-then-watch on raw watch streams: resume from the last resourceVersion, bookmarks, 410 Gone.

The loop: list (paged) -> hand the full set to `on_sync` (reconcile) -> watch from the list's
resourceVersion with bookmarks -> on a closed stream or a network error, resume from the last
resourceVersion seen -> on 410 Gone (the version was compacted), list again and reconcile.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson

from controller.kube import Kube, KubeError

log = logging.getLogger("mtsched.reflector")

Handler = Callable[[str, dict[str, Any]], Awaitable[None]]
SyncHandler = Callable[[list[dict[str, Any]]], Awaitable[None]]


class Gone(Exception):
    """The watch's resourceVersion is too old: a re-list is needed."""


class Reflector:
    def __init__(self, kube: Kube, path: str, on_event: Handler, on_sync: SyncHandler, name: str,
                 page_size: int = 500, label_selector: str = "", field_selector: str = ""):
        self.kube = kube
        self.path = path
        self.on_event = on_event
        self.on_sync = on_sync
        self.name = name
        self.page_size = page_size
        self.selectors = {k: v for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector))
                          if v}
        self.resource_version = ""
        self.synced = asyncio.Event()
        self.relists = 0
        self.resumes = 0
        self.events = 0

    async def list(self) -> tuple[list[dict[str, Any]], str]:
        items: list[dict[str, Any]] = []
        cont = ""
        while True:
            query: dict[str, Any] = {"limit": self.page_size, **self.selectors}
            if cont:
                query["continue"] = cont
            try:
                page = await self.kube.request("GET", self.path, query=query)
            except KubeError as e:
                if e.status == 410 and cont:  # the continue token expired mid-list: start over
                    items, cont = [], ""
                    continue
                raise
            items.extend(page.get("items") or [])
            cont = (page.get("metadata") or {}).get("continue") or ""
            if not cont:
                return items, str((page.get("metadata") or {}).get("resourceVersion") or "")

    async def run(self) -> None:
        backoff = 0.2
        while True:
            try:
                items, rv = await self.list()
                self.relists += 1
                await self.on_sync(items)
                self.resource_version = rv
                self.synced.set()
                backoff = 0.2
                await self._watch()
            except Gone:
                log.info("%s: resourceVersion %s expired (410): re-listing", self.name, self.resource_version)
            except asyncio.CancelledError:
                raise
            except (TimeoutError, KubeError, aiohttp.ClientError, OSError) as e:
                log.warning("%s: list failed (%s); retrying in %.1fs", self.name, e, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)

    async def _watch(self) -> None:
        """Watch until Gone; resumes transparently after closed streams and network errors."""
        backoff = 0.2
        while True:
            query = {"watch": "true", "allowWatchBookmarks": "true", "resourceVersion": self.resource_version,
                     # the server closes the stream after this; we resume from the last version
                     "timeoutSeconds": random.randint(240, 300), **self.selectors}
            try:
                resp = await self.kube.raw("GET", self.path, query=query,
                                           timeout=aiohttp.ClientTimeout(total=None, sock_read=330, connect=10))
                async with resp:
                    if resp.status == 410:
                        raise Gone()
                    if resp.status != 200:
                        raise KubeError(resp.status, (await resp.read()).decode(errors="replace"), "watch")
                    backoff = 0.2
                    async for line in resp.content:
                        if not line.strip():
                            continue
                        await self._handle(orjson.loads(line))
                self.resumes += 1
            except (Gone, asyncio.CancelledError):
                raise
            except (TimeoutError, KubeError, aiohttp.ClientError, OSError, orjson.JSONDecodeError) as e:
                self.resumes += 1
                log.warning("%s: watch interrupted (%s); resuming from %s in %.1fs", self.name, e,
                            self.resource_version, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)

    async def _handle(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone()
            raise KubeError(int(obj.get("code") or 500), obj, "watch event")
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if kind == "BOOKMARK":
            if rv:
                self.resource_version = rv
            return
        self.events += 1
        await self.on_event(str(kind), obj)
        if rv:
            self.resource_version = rv  # only after handling, so a crash mid-event replays it
