"""List-then-watch on raw watch streams: resume from the last resourceVersion, bookmarks, 410 Gone.

The loop: list (paged) -> hand the full set to `on_sync` (reconcile) -> watch from the list's
resourceVersion with bookmarks -> on a closed stream or a network error, resume from the last
resourceVersion seen -> on 410 Gone (the version was compacted), list again and reconcile.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import orjson

from shared.domain.throttle import retry_after_s, status_retry_after
from shared.kube import BadAnswer, Kube, KubeError, the_list
from shared.serving.metrics import WATCH_RELISTS, WATCH_RESUMES
from shared.serving.supervise import Backoff, asked_wait, is_transient

log = logging.getLogger("mtsched.reflector")

Handler = Callable[[str, dict[str, Any]], Awaitable[None]]
SyncHandler = Callable[[list[dict[str, Any]]], Awaitable[None]]


class Gone(Exception):
    """The watch's resourceVersion is too old: a re-list is needed."""


class HandlerError(Exception):
    """Handling an event failed (e.g. Redis is down): the event is replayed when the watch resumes."""


# A watch event is one JSON line holding a whole object; etcd allows objects of ~1.5 MB, and JSON
# escaping can double that. aiohttp's line reader gives up at 128 KiB, so lines are split here.
MAX_LINE = 16 * 1024 * 1024
# A list whose continue token expired (410) starts over at once this many times (etcd compacted during a long
# list); after that it starts over with backoff, not in a tight loop.
LIST_RESTARTS = 2
# A watch stream that ends sooner than this without a line (no event, no bookmark) is a failure, waited for with
# backoff like one: a server or proxy that closes every stream at once is not asked again thousands of times a
# second, and the stream counts as failing for readiness.
SHORT_WATCH_S = 1.0
# A page of a list answered 429 is asked again after its Retry-After while the waits add up to no more than this,
# rather than the whole list starting over (of a list of many pages under API Priority and Fairness, one page in
# ten turned down made the list start over nine times in ten, each time adding its pages to the load)
PAGE_PATIENCE_S = 10.0
# A watch request whose answer has not begun after this long is abandoned and asked again (a failure, with backoff).
# kube-apiserver answers a watch at once (a resourceVersion its cache has not reached yet: within 3 s, API Priority
# and Fairness's queue: within a quarter of its request timeout, 15 s); without this bound the wait was the stream's
# read timeout (then 330 s): an API server replica that accepts connections but does not answer (a frozen process: the
# kernel still accepts) left the view stale for 5.5 minutes with readiness fine. Unanswered for 10 s, the stream
# counts as failing (problem()).
WATCH_OPEN_S = 30.0
# A watch answered 410 within SHORT_WATCH_S of its list, nothing handled (a replica behind a balancer whose watch
# cache no longer holds the list's version), is listed again at once this many times in a row; after that with
# backoff, the stream failing until a watch works: each re-list is a full list and a reconcile.
GONE_RELISTS = 2
# The server ends each watch after a time in WATCH_SECONDS (random: replicas' streams do not reopen in step), with a
# bookmark first when the watch asked for them; a stream silent for WATCH_READ_S, longer than any of them lasts, was
# ended by nobody: an API server replica frozen while its kernel still answers TCP keepalives. It is abandoned and
# resumed then (through a balancer, on another replica). Was 240-300 s and 330 s: such a stream kept its part of the
# view stale for 5.5 minutes; a watch resumed from the last version costs the server little.
WATCH_SECONDS = (60, 90)
WATCH_READ_S = 120


async def lines(content: aiohttp.StreamReader, max_line: int = MAX_LINE) -> AsyncIterator[bytes]:
    """The newline-separated lines of a stream, of any length up to `max_line` (longer: ValueError)."""
    buf = bytearray()
    async for chunk in content.iter_any():
        start = 0
        while True:
            nl = chunk.find(b"\n", start)
            if nl < 0:
                buf += chunk[start:]
                break
            if buf:
                buf += chunk[start:nl]
                yield bytes(buf)
                buf.clear()
            else:
                yield chunk[start:nl]
            start = nl + 1
        if len(buf) > max_line:
            raise ValueError(f"watch line longer than {max_line} bytes")
    if buf:
        yield bytes(buf)


# A watch stream is idle between events (bookmarks came 1-3 minutes apart on a quiet cluster): a connection whose
# peer vanished without a reset (a node of the API server lost, a NAT or balancer that dropped it) would be seen
# only at sock_read (WATCH_READ_S), with the view blind and nobody told. TCP keepalive probes it after KEEPALIVE_IDLE s
# of silence, every KEEPALIVE_INTERVAL s, KEEPALIVE_COUNT times: a dead peer ends the stream within ~1 minute.
KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_COUNT = 30, 10, 3


def keep_alive(resp: aiohttp.ClientResponse) -> bool:
    """Turn TCP keepalive on for the response's connection (what the platform offers); whether it was."""
    conn = getattr(resp, "connection", None)  # best effort: never what ends a watch
    transport = conn.transport if conn is not None else None
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE), ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
                            ("TCP_KEEPCNT", KEEPALIVE_COUNT)):
            if hasattr(socket, name):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    except OSError as e:  # a transport that is not TCP: nothing to probe
        log.debug("no TCP keepalive on the watch connection: %s", e)
        return False
    return True


def slim(obj: Any) -> Any:
    """The object without what no handler reads and the API server sends with every object:
    `metadata.managedFields` (server-side apply's field owners, often the largest part of a node or a pod),
    and a node's `status.images` and `status.volumesAttached` (every image on the node with its digests: tens of
    KiB per node, held for every node while a list lasts)."""
    if not isinstance(obj, dict):
        return obj
    meta, status = obj.get("metadata"), obj.get("status")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    if isinstance(status, dict):
        status.pop("images", None)
        status.pop("volumesAttached", None)
    return obj


class Reflector:
    def __init__(self, kube: Kube, path: str, on_event: Handler, on_sync: SyncHandler, name: str,
                 page_size: int = 500, label_selector: str = "", field_selector: str = "",
                 shape: Callable[[Any], Any] = slim):
        self.kube = kube
        # what is kept of each object, page by page and event by event (a list holds every object until on_sync)
        self.shape = shape
        self.path = path
        self.on_event = on_event
        self.on_sync = on_sync
        self.name = name
        self.page_size = page_size
        self.selectors = {k: v for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector))
                          if v}
        self.resource_version = ""
        self.synced = asyncio.Event()
        self.events = 0
        self._poison, self._poison_rv = 0, ""
        # Readiness: when the stream last worked (opened, or an event/bookmark handled), and since when
        # it has been failing. A watch that resumes within seconds is routine (the server closes it
        # every few minutes); one that stays down means our view of the cluster is going stale.
        self.failing_since: float | None = None
        self.last_error = ""
        # since when it has worked without a failure (None: failing, or (re-)listing); a stream that just
        # resumed may still be replaying the events it missed (Reflector.unsettled)
        self.live_since: float | None = None
        # since when a re-list (after the first) has been running: the view is the one from before it until
        # its on_sync is done (a 410 after an outage, or a failed stream listed again)
        self.listing_since: float | None = None
        self.opening_since: float | None = None  # since when a watch request has waited for its answer to begin
        self.on_resync: list[Callable[[], None]] = []  # called after every (re-)list: reconcile soon
        self._gone_quick = 0  # watches in a row answered 410 at once after their list (GONE_RELISTS)

    async def list(self) -> tuple[list[dict[str, Any]], str]:
        """Every object, page by page (slimmed as each page comes: the whole set is held until on_sync),
        and the list's resourceVersion."""
        items: list[dict[str, Any]] = []
        cont = ""
        restarts = 0
        backoff = Backoff()
        while True:
            query: dict[str, Any] = {"limit": self.page_size, **self.selectors}
            if cont:
                query["continue"] = cont
            try:
                page = await self.kube.request("GET", self.path, query=query, patience=PAGE_PATIENCE_S)
            except KubeError as e:
                if e.status != 410 or not cont:
                    raise
                # the token expired mid-list: start over (not raised: a 410 is no transient error to the supervisor
                # of a rebuild, whose lists these are too), at once for the first LIST_RESTARTS times
                if restarts >= LIST_RESTARTS:
                    log.warning("%s: the list's continue token expired again (%s); starting over in %.1fs", self.name,
                                e, backoff.delay)
                    await backoff.sleep()
                items, cont, restarts = [], "", restarts + 1
                continue
            items.extend(self.shape(item) for item in the_list(page, f"GET {self.path}"))  # (else 502: no list)
            cont = (page.get("metadata") or {}).get("continue") or ""
            if not cont:
                return items, str((page.get("metadata") or {}).get("resourceVersion") or "")

    def _working(self) -> None:
        if self.live_since is None and self.listing_since is None:
            self.live_since = time.monotonic()
        self.failing_since = None
        self.last_error = ""

    def _failing(self, e: BaseException) -> None:
        self.failing_since = self.failing_since or self.opening_since or time.monotonic()
        self.live_since = None
        self.last_error = f"{type(e).__name__}: {e}"[:300]

    def problem(self, max_failing: float = 10.0) -> str:
        """Why this stream cannot be trusted now ("" when it can): for readiness."""
        if not self.synced.is_set():
            return f"{self.name}: not listed yet" + (f" ({self.last_error})" if self.last_error else "")
        if self.failing_since is not None and time.monotonic() - self.failing_since >= max_failing:
            return f"{self.name}: stream failing for {time.monotonic() - self.failing_since:.0f}s ({self.last_error})"
        if self.listing_since is not None and time.monotonic() - self.listing_since >= max_failing:
            return f"{self.name}: re-listing for {time.monotonic() - self.listing_since:.0f}s (the view predates it)"
        # (at least 1 s: every resume waits a moment for its answer)
        if self.opening_since is not None and time.monotonic() - self.opening_since >= max(max_failing, 1.0):
            return (f"{self.name}: watch request not answered for {time.monotonic() - self.opening_since:.0f}s "
                    "(the view may be stale)")
        return ""

    def unsettled(self, settle: float) -> str:
        """problem(0), or why the view may still lack events: the stream has worked for less than `settle`
        seconds since it was listed or resumed ("" when it has worked longer)."""
        why = self.problem(0)
        if why:
            return why
        since = 0.0 if self.live_since is None else time.monotonic() - self.live_since
        if self.live_since is None or since < settle:
            return f"{self.name}: stream working again for {since:.1f}s only (its missed events may still come)"
        return ""

    async def run(self) -> None:
        backoff = Backoff()
        while True:
            try:
                # the view stays the one from before this list until on_sync is done: not live meanwhile
                self.live_since = None
                if self.synced.is_set() and self.listing_since is None:
                    self.listing_since = time.monotonic()
                items, rv = await self.list()
                WATCH_RELISTS.labels(self.name).inc()
                try:
                    await self.on_sync(items)
                except Exception as e:
                    raise HandlerError(f"{self.name}: reconcile after list failed: {e}") from e
                self.resource_version = rv
                self.synced.set()
                self.listing_since = None
                looping = self._gone_quick > GONE_RELISTS
                if not looping:  # (else failing until a watch works: _held_open, or a line handled)
                    self._working()
                for cb in self.on_resync:
                    cb()
                if not looping:
                    backoff.reset()
                watched = time.monotonic()
                try:
                    await self._watch()
                except Gone:
                    quick = self.resource_version == rv and time.monotonic() - watched < SHORT_WATCH_S
                    self._gone_quick = self._gone_quick + 1 if quick else 0
                    raise
            except Gone:
                if self._gone_quick > GONE_RELISTS:
                    self._failing(Gone(f"every watch answered 410 at once, {self._gone_quick} in a row"))
                    log.warning("%s: the watch from a fresh list was answered 410 (Gone) %d times in a row; "
                                "listing again in %.1fs", self.name, self._gone_quick, backoff.delay)
                    await backoff.sleep()
                else:
                    log.info("%s: resourceVersion %s expired (410): re-listing", self.name, self.resource_version)
            except asyncio.CancelledError:
                raise
            except (TimeoutError, KubeError, aiohttp.ClientError, OSError, HandlerError, ValueError) as e:
                self._failing(e)
                log.warning("%s: list failed (%s); retrying in %.1fs", self.name, e, max(backoff.delay, asked_wait(e)))
                await backoff.sleep(after=e)

    async def _watch(self) -> None:
        """Watch until Gone; resumes transparently after closed streams and network errors."""
        backoff = Backoff()
        # the last stream ended (or failed, not in a handler) within SHORT_WATCH_S of opening, nothing handled: the
        # next one counts as working once a line of it is handled, not when it opens, and the backoff grows (so does
        # the first after watches answered 410 at once again and again)
        short = self._gone_quick > GONE_RELISTS
        while True:
            query = {"watch": "true", "allowWatchBookmarks": "true", "resourceVersion": self.resource_version,
                     # the server closes the stream after this; we resume from the last version
                     "timeoutSeconds": random.randint(*WATCH_SECONDS), **self.selectors}
            opened: float | None = None
            handled = False
            held: asyncio.TimerHandle | None = None
            try:
                self.opening_since = time.monotonic()
                try:
                    async with asyncio.timeout(WATCH_OPEN_S):
                        resp = await self.kube.raw("GET", self.path, query=query,
                                                   timeout=aiohttp.ClientTimeout(total=None, sock_read=WATCH_READ_S,
                                                                                 connect=10))
                except TimeoutError as e:
                    raise TimeoutError(f"watch request not answered within {WATCH_OPEN_S:g}s") from e
                self.opening_since = None
                async with resp:
                    keep_alive(resp)
                    if resp.status == 410:
                        raise Gone()
                    if resp.status != 200:
                        if resp.status in (401, 403):
                            self.kube.denied()
                        raise KubeError(resp.status, (await resp.read()).decode(errors="replace"), "watch",
                                        retry_after_s(resp.headers.get("Retry-After")))
                    opened = time.monotonic()
                    if not short:
                        backoff.reset()
                        self._working()
                    else:  # open SHORT_WATCH_S without failing: working, quiet as it may be (events come
                        # minutes apart on a quiet cluster, bookmarks a minute or more apart)
                        held = asyncio.get_running_loop().call_later(SHORT_WATCH_S, self._held_open, backoff)
                    async for line in lines(resp.content):
                        if not line.strip():
                            continue
                        await self._handle(orjson.loads(line))
                        if not handled:
                            handled, short, self._gone_quick = True, False, 0
                            backoff.reset()
                            self._working()
                    if not handled and time.monotonic() - opened < SHORT_WATCH_S:
                        raise BadAnswer(f"watch stream ended after {time.monotonic() - opened:.2f}s without an event")
                short = False  # ended after SHORT_WATCH_S or more, or said something: not short
                WATCH_RESUMES.labels(self.name).inc()
            except (Gone, asyncio.CancelledError):
                raise
            except (TimeoutError, KubeError, aiohttp.ClientError, OSError, orjson.JSONDecodeError, ValueError,
                    HandlerError) as e:
                if held is not None:  # ended: not taken for one held open while the backoff below is slept
                    held.cancel()
                if opened is not None and not isinstance(e, HandlerError):  # short, or not (open long enough)
                    short = not handled and time.monotonic() - opened < SHORT_WATCH_S
                elif isinstance(e, HandlerError) and not handled:
                    # its first event failed (Redis away): the next stream, which replays it, is no success when it
                    # opens either. It reset the backoff, and the watch was opened again every 0.2 s for as long as
                    # Redis was away (tests/unit/test_redteam_flood_relist.py)
                    short = True
                # A failed handler left resource_version at the event before it: resuming replays it.
                self._failing(e)
                if isinstance(e, HandlerError) and e.__cause__ is not None and not is_transient(e.__cause__):
                    self._poison = self._poison + 1 if self._poison_rv == self.resource_version else 1
                    self._poison_rv = self.resource_version
                    if self._poison >= 5:  # the same event keeps failing for a reason no retry cures
                        raise e.__cause__ from e
                WATCH_RESUMES.labels(self.name).inc()
                log.warning("%s: watch interrupted (%s); resuming from %s in %.1fs", self.name, e,
                            self.resource_version, max(backoff.delay, asked_wait(e)))
                await backoff.sleep(after=e)
            finally:
                self.opening_since = None
                if held is not None:
                    held.cancel()

    def _held_open(self, backoff: Backoff) -> None:
        """A stream opened after a short one has stayed open SHORT_WATCH_S: it works."""
        self._gone_quick = 0
        backoff.reset()
        self._working()

    async def _handle(self, event: Any) -> None:
        if not isinstance(event, dict):
            raise BadAnswer(f"{self.name}: a watch event that is not a JSON object: {str(event)[:120]!r}")
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone()
            if obj.get("code") in (401, 403):
                self.kube.denied()
            # a stream's error has no headers: its Status says when to come back (the watch is resumed after it)
            raise KubeError(int(obj.get("code") or 500), obj, "watch event", status_retry_after(obj))
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if kind == "BOOKMARK":
            if rv:
                self.resource_version = rv
            return
        self.events += 1
        try:
            await self.on_event(str(kind), self.shape(obj))
        except asyncio.CancelledError:
            raise
        except Exception as e:
            raise HandlerError(f"{self.name}: handling {kind} failed: {type(e).__name__}: {e}") from e
        if rv:
            self.resource_version = rv  # only after handling, so a crash mid-event replays it
