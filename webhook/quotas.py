"""Reads what the quota rule needs from the API server: the namespace's ResourceQuotas and, when one
of them uses a form only we enforce (`limits.mthreads.com/...` or the bare name), its live pods.

The quotas are a quorum read (a quota created a moment ago holds at once). The pods, read for the pod
creates in such a namespace, are read consistently (no resourceVersion: what the API server has committed;
Kubernetes 1.31+ answers it from its watch cache, paged) and bounded: only the non-terminal pods (field
selector), in pages of PAGE, no more than MAX_PODS, and of each only its quota view (shared/domain/quota.py
quota_view: nothing of a pod without our resources). One read per namespace serves every review waiting for
it: a review waits for a read that began after it arrived, so it sees every pod admitted before it, and a
burst in one namespace costs two reads, not one per review (40 reviews at once over 3,000 pods took the webhook
400 MiB and 11-70 s, each reading the namespace: red team). At most MAX_POD_READS namespaces are read at once.
A failed or unbounded read refuses the pod (fail closed). The rule is shared/domain/quota.py.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol
from urllib.parse import quote

from shared.config import Config
from shared.domain.admission import Decision, deny
from shared.domain.quota import QuotaError, enforced_keys, judge_quotas, quota_view
from shared.kube import ServerClock
from shared.serving.bounded import ByteLRU
from shared.serving.metrics import QUOTA_CHECKS
from shared.serving.supervise import is_transient

log = logging.getLogger("mtsched.webhook")

# The namespace's pods the API server still charges (terminal pods hold nothing).
LIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"
READ_TIMEOUT = 5.0  # one API read
# A read answered 429 (API Priority and Fairness) is sent again after its Retry-After when the waits add up to no
# more than this: the review is admitted a moment later rather than refused (CHECK_SECONDS bounds it all)
READ_PATIENCE = 2.0
# the whole check of one review (the namespace's quotas, then its pods, page by page): well inside the
# webhook's timeout at the API server (chart default 10 s, at least 6: templates/validate.yaml)
CHECK_SECONDS = 5.0
PAGE = 500  # pods per list answer when the API server pages
MAX_PODS = 10_000  # more live pods than this in one namespace: the pod is refused, the check stays bounded
# A namespace's quotas (only those naming a form we enforce) are re-read at most this often: one API call per
# namespace per interval instead of one per pod (a burst of 1,000 pods paid ~50 ms each). A quota created or
# changed is enforced by us within this many seconds; the API server's own quota admission also reads an
# informer cache. Reviews that miss the cache together share one read (a burst of 32 reviews in flight sent
# 32 reads each time the entry lapsed), and a namespace in use is read again in the last quarter of the
# interval, so its reviews do not wait for the read (an API server busy with a burst answers in 0.5 s): no
# answer is older than the interval either way. The pods a quota charges are always read fresh.
QUOTA_CACHE_SECONDS = 2.0
QUOTA_CACHE_BYTES = 4 * 1024 * 1024
# Quota reads in flight at once, every namespace together: reviews naming many namespaces (a caller the webhook
# does not authenticate may send any) queue instead of fanning out at the API server. (The pods of a namespace
# are read per review, bounded by the reviews in flight, and only where a quota of ours exists.)
MAX_READS = 8
MAX_POD_READS = 4  # namespaces whose pods are read at once (each read serves all its namespace's reviews)


class Api(Protocol):
    async def request(self, method: str, path: str, body: Any = None, query: Mapping[str, Any] | None = None,
                      ok: tuple[int, ...] = (200, 201), content_type: str = "application/json",
                      timeout: float = 30.0, *, patience: float = 0.0) -> Any: ...


class QuotaReader:
    def __init__(self, api: Api, cfg: Config, page: int = PAGE, max_pods: int = MAX_PODS,
                 cache_seconds: float = QUOTA_CACHE_SECONDS, clock: Callable[[], float] = time.monotonic):
        self.api = api
        self.clock = clock
        self.cfg = cfg
        self.keys = enforced_keys(cfg)
        self.page, self.max_pods = page, max_pods
        self.cache_seconds = cache_seconds
        self._quotas: ByteLRU[str, tuple[float, list[Mapping[str, Any]]]] = ByteLRU(QUOTA_CACHE_BYTES)
        self._reading: dict[str, asyncio.Future[list[Mapping[str, Any]]]] = {}  # reads in flight, by namespace
        self._reads = asyncio.Semaphore(MAX_READS)
        # namespace -> [the pod read in flight, the next one (its waiters arrived after the first began)]
        self._pod_reads: dict[str, list[asyncio.Future[list[Mapping[str, Any]]] | None]] = {}
        self._pod_sem = asyncio.Semaphore(MAX_POD_READS)

    async def quotas(self, namespace: str) -> list[Mapping[str, Any]]:
        """The namespace's ResourceQuotas that name a form we enforce (read at most every cache_seconds; a
        read in flight is shared, so no answer is older than the cache allows)."""
        now = self.clock()
        hit = self._quotas.get(namespace)
        if hit is not None and now < hit[0]:
            if now >= hit[0] - self.cache_seconds / 4:
                self._flight(namespace)  # read again ahead of the lapse: a busy namespace never waits for it
            return hit[1]
        # shielded: a review whose caller went away does not cancel the read the others wait for
        return await asyncio.shield(self._flight(namespace))

    def _flight(self, namespace: str) -> asyncio.Future[list[Mapping[str, Any]]]:
        """The read of the namespace's quotas in flight (started when there is none)."""
        flight = self._reading.get(namespace)
        if flight is None:
            flight = asyncio.ensure_future(self._read_quotas(namespace))
            self._reading[namespace] = flight
            flight.add_done_callback(functools.partial(self._landed, namespace))
        return flight

    def _landed(self, namespace: str, flight: asyncio.Future[list[Mapping[str, Any]]]) -> None:
        if self._reading.get(namespace) is flight:
            del self._reading[namespace]
        if not flight.cancelled() and flight.exception() is not None:
            # retrieved, and said once: a read ahead of the lapse fails with nobody waiting (the entry still
            # lapses on time, and the reviews after it refuse until a read succeeds)
            log.warning("reading the ResourceQuotas of namespace %s failed: %s", namespace, flight.exception())

    async def _read_quotas(self, namespace: str) -> list[Mapping[str, Any]]:
        now = self.clock()
        async with self._reads:
            items = await self._items(f"/api/v1/namespaces/{quote(namespace, safe='')}/resourcequotas")
        mine = [q for q in items if any(k in self.keys for k in ((q.get("spec") or {}).get("hard") or {}))]
        if self.cache_seconds > 0:
            self._quotas.put(namespace, (now + self.cache_seconds, mine), 200 + len(namespace) + len(repr(mine)))
        return mine

    async def _list(self, path: str, query: Mapping[str, str] | None = None) -> tuple[list[Mapping[str, Any]], str]:
        """(items, continue token or "")."""
        # a 429 is sent again after the wait it asks for, if that fits READ_PATIENCE (Kube.request)
        out = await self.api.request("GET", path, query=query, timeout=READ_TIMEOUT, patience=READ_PATIENCE)
        items = out.get("items") if isinstance(out, dict) else None
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise QuotaError(f"GET {path}: the answer has no list of items")
        token = (out.get("metadata") or {}).get("continue") or ""
        if not isinstance(token, str):
            raise QuotaError(f"GET {path}: metadata.continue is not a string")
        return items, token

    async def _items(self, path: str) -> list[Mapping[str, Any]]:
        return (await self._list(path))[0]

    async def live_pods(self, namespace: str) -> list[Mapping[str, Any]]:
        """The quota views of the namespace's non-terminal pods, from a read that began after this call (shared
        with every call waiting for the same one); the read goes on if this caller stops waiting."""
        st = self._pod_reads.get(namespace)
        if st is None:
            st = self._pod_reads[namespace] = [None, None]
        if st[0] is None:  # none in flight: this call starts one
            flight = st[0] = self._waiting()
            self._begin(namespace, flight)
        else:  # the read in flight began before this call: the next one, which begins when it lands
            flight = st[1] = st[1] or self._waiting()
        return await asyncio.shield(flight)

    @staticmethod
    def _waiting() -> asyncio.Future[list[Mapping[str, Any]]]:
        fut: asyncio.Future[list[Mapping[str, Any]]] = asyncio.get_running_loop().create_future()
        # retrieved even when every waiter gave up (a failure is logged by judge where one waits)
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())
        return fut

    def _begin(self, namespace: str, into: asyncio.Future[list[Mapping[str, Any]]]) -> None:
        task = asyncio.ensure_future(self._read_pods(namespace))
        task.add_done_callback(functools.partial(self._pods_landed, namespace, into))

    def _pods_landed(self, namespace: str, into: asyncio.Future[list[Mapping[str, Any]]],
                     task: asyncio.Future[list[Mapping[str, Any]]]) -> None:
        if not into.done():
            if task.cancelled():
                into.cancel()
            elif (e := task.exception()) is not None:
                into.set_exception(e)
            else:
                into.set_result(task.result())
        st = self._pod_reads.get(namespace)
        if st is None or st[0] is not into:
            return
        st[0], st[1] = st[1], None
        if st[0] is None:
            del self._pod_reads[namespace]
        else:
            self._begin(namespace, st[0])

    async def _read_pods(self, namespace: str) -> list[Mapping[str, Any]]:
        """The namespace's non-terminal pods, page by page (at most max_pods), as quota views."""
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods"
        query = {"fieldSelector": LIVE_PODS, "limit": str(self.page)}
        views: list[Mapping[str, Any]] = []
        read = 0
        async with self._pod_sem:
            while True:
                items, token = await self._list(path, query)
                read += len(items)
                if read > self.max_pods:
                    raise QuotaError(f"namespace {namespace} has more than {self.max_pods} live pods; the quota "
                                     "check reads no more")
                views += [v for p in items if (v := quota_view(p, self.cfg)) is not None]
                del items  # the page's pods go now, not with the next page
                if not token:
                    return views
                # the token carries the snapshot's resourceVersion: the next pages read the same one
                query = {"fieldSelector": LIVE_PODS, "limit": str(self.page), "continue": token}

    async def judge(self, namespace: str, pod: Mapping[str, Any], decision: Decision) -> Decision:
        """The decision, or a refusal when the pod exceeds a quota only we enforce (or we cannot tell)."""
        asked = dict(decision.usage)
        if not decision.allowed or not asked:
            return decision
        try:
            async with asyncio.timeout(CHECK_SECONDS):  # one deadline for every read of this review
                quotas = await self.quotas(namespace)
                pods: Sequence[Mapping[str, Any]] = []
                if quotas:
                    pods = await self.live_pods(namespace)
            # the API server's clock, which wrote the deletion timestamps it is compared with: a step of this
            # host's wall clock must not stop charging pods still in their grace period (nor charge stuck ones
            # longer). Not known yet (no dated answer): 0, every terminating pod charged, refusing the more.
            clock = getattr(self.api, "server_clock", None)
            now = (clock.now() if isinstance(clock, ServerClock) else None) or 0.0
            refusal = judge_quotas(pod, asked, quotas, pods, self.cfg, now=now)
        except Exception as e:  # fail closed: a quota we cannot check is not a quota that holds
            QUOTA_CHECKS.labels("error").inc()
            if isinstance(e, TimeoutError) and not str(e):
                e = TimeoutError(f"the API server did not answer within {CHECK_SECONDS:g} s")
            log.warning("quota check in namespace %s failed: %s", namespace, e)
            # 503 while the API server is away (clients retry a server error), 403 for what stays so
            return deny(f"cannot check the ResourceQuotas of namespace {namespace}: {e}; the pod is refused "
                        "until they can be read (retry)", 503 if is_transient(e) else 403)
        if not quotas:
            return decision
        QUOTA_CHECKS.labels("denied" if refusal else "allowed").inc()
        if refusal:
            return deny(refusal)
        return decision
