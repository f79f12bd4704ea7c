"""A thin raw-JSON client over kubernetes-asyncio's ApiClient (auth, TLS, kubeconfig handling).

We keep Kubernetes objects as plain dicts (decoded with orjson): the domain functions take dicts,
and skipping the generated models keeps watch streams of thousands of pods cheap.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import logging
import os
import time
import urllib.request
from collections.abc import Callable, Mapping
from email.utils import parsedate_to_datetime
from typing import Any, cast
from urllib.parse import urlencode

import aiohttp
import orjson
from aiohttp.helpers import get_env_proxy_for_url
from kubernetes_asyncio import client, config
from yarl import URL

from shared.domain.throttle import retry_after_s, status_retry_after, wait_to_resend
from shared.domain.timing import BIND_ANSWER_SLACK_S, BIND_CONNECT_S, BIND_MIN_LEFT_S

log = logging.getLogger("mtsched.kube")


SERVER_DEADLINE_MIN_MS = 100  # less than this for the API server: the request is not sent (raw's `until`)


class NotSent(Exception):
    """A request with a deadline (raw's `until`) that was not sent: too little of it was left."""


class BadAnswer(aiohttp.ClientPayloadError):
    """A 2xx answer whose body is not the JSON object asked for (cut short, or not JSON at all: a proxy's page):
    a fault on the way, retried like a dropped connection (an aiohttp.ClientError, transient), never handed on as
    if it were the object."""


class Shed(Exception):
    """A best-effort request (an Event) not sent: too many of them wait already (Kube.request's `best_effort`)."""


# Best-effort requests (Events) at once: they never take more than this many of the pool's connections
# (connection_pool_maxsize, 64), so a slow events store cannot leave a Binding or a watch without one ...
BEST_EFFORT_IN_FLIGHT = 8
BEST_EFFORT_WAITING = 256  # ... more than this many waiting for their turn: the next is shed (Shed)
BEST_EFFORT_TIMEOUT = 10.0  # one best-effort request, its wait for a turn not counted
# A read of one pod or node answered 429 is sent again after its Retry-After when the waits add up to no more than
# this: within the 4 s bind gives such a read (controller/extender.py BIND_READ_S), with time left for the answer.
READ_PATIENCE_S = 2.0


class ServerClock:
    """The API server's clock, from the `Date` header of its last answer (1 s resolution) and the time since on
    this host's monotonic clock: what a decision compares with the timestamps the API server writes
    (`deletionTimestamp`) uses it, so that a step of this host's wall clock cannot move it. The header is
    parsed only when asked."""

    def __init__(self) -> None:
        self._date: str | None = None
        self._at = 0.0

    def note(self, date: str | None) -> None:
        if date:
            self._date, self._at = date, time.monotonic()

    def now(self) -> float | None:
        """Seconds since the epoch on the API server's clock; None before any dated answer."""
        if self._date is None:
            return None
        try:
            return parsedate_to_datetime(self._date).timestamp() + (time.monotonic() - self._at)
        except (TypeError, ValueError):
            return None


class KubeError(RuntimeError):
    def __init__(self, status: int, body: Any, what: str, retry_after: float | None = None):
        self.status = status
        self.body = body
        # the wait the answer's Retry-After asks for (shared/domain/throttle.py), which every retry loop honours
        self.retry_after = retry_after
        msg = body.get("message") if isinstance(body, dict) else str(body)[:300]
        super().__init__(f"{what}: HTTP {status}: {msg}")


def _the_object(answer: Any, kind: str, name: str, namespace: str | None, what: str) -> dict[str, Any]:
    """The object a read asked for, or a 502: a success answer that is something else (`{}` or another object
    from a misbehaving proxy) read as the pod would say "no such pod here", and the reconciler would free the
    cards of a running one. Taken as the API server unreachable (transient: retried, nothing decided on it)."""
    meta = answer.get("metadata") if isinstance(answer, dict) else None
    if (isinstance(meta, dict) and meta.get("name") == name and answer.get("kind", kind) == kind
            and (namespace is None or meta.get("namespace") == namespace)):
        return cast("dict[str, Any]", answer)
    raise KubeError(502, {"message": f"the answer is not the {kind} asked for: {str(answer)[:200]}"}, what)


def the_list(answer: Any, what: str) -> list[Any]:
    """The items of a list's page, or a 502 as `_the_object`'s: a success answer that is no list (`{}`, a Status,
    an object, from a misbehaving proxy) read as an empty list said "no pods": the watchers' re-list emptied their
    view (its quarantines lifted) and went on watching from no version, the reconciler's consistent read of a node
    (what verifies it after a Redis failover) missed the Bindings it exists to catch. Every list page the API
    server sends is a *List with its metadata and its items (null: none)."""
    if not isinstance(answer, dict) or "items" not in answer:
        raise KubeError(502, {"message": f"the answer is not a list: {str(answer)[:200]}"}, what)
    items, kind = answer["items"], answer.get("kind", "List")
    if not isinstance(items, list | None):
        raise BadAnswer(f"{what}: the answer has no list of items")
    if isinstance(answer.get("metadata"), dict) and isinstance(kind, str) and kind.endswith("List"):
        return items or []
    raise KubeError(502, {"message": f"the answer is not a list: {str(answer)[:200]}"}, what)


def _bypassed_by_cidr(host: str | None) -> bool:
    """Whether NO_PROXY names the API server's address by a CIDR (`10.96.0.0/12`, the usual way to exempt a
    cluster's service network): Go's clients match those, Python's proxy lookup only host names and
    suffixes, so an in-cluster API server would be sent to the proxy."""
    try:
        address = ipaddress.ip_address((host or "").strip("[]"))
    except ValueError:
        return False  # a name: the lookup's own suffix matching applies
    # the variable Python's lookup reads (lowercase first, even set empty), so names and CIDRs agree
    raw = urllib.request.getproxies_environment().get("no", "")
    for entry in raw.split(","):
        try:
            if address in ipaddress.ip_network(entry.strip(), strict=False):
                return True
        except ValueError:
            continue  # a host name, `*`, or a CIDR of the other family
    return False


def _read_env_once(api: client.ApiClient) -> None:
    """kubernetes-asyncio's session trusts the environment: for every request aiohttp then looks up the
    proxy variables and a ~/.netrc in a worker thread (two thread hops, ~0.6 ms of CPU per API call
    in-process, a large share of the extender's CPU under load). A process's environment does not change
    and this session only calls the API server, so its proxy (NO_PROXY honoured, CIDR entries too as Go's
    clients match them: `_bypassed_by_cidr`) is looked up once here and made the session's default, and the
    per-request lookups are off. A netrc file keeps them on (aiohttp would read credentials from it)."""
    rest = getattr(api, "rest_client", None)
    session = getattr(rest, "pool_manager", None)
    if (rest is None or not isinstance(session, aiohttp.ClientSession)
            or not all(hasattr(session, a) for a in ("_trust_env", "_default_proxy", "_default_proxy_auth"))):
        return  # another kubernetes-asyncio or aiohttp: left as it is
    netrc = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    if os.path.exists(netrc):
        return
    host = URL(str(api.configuration.host))
    if not rest.proxy and not _bypassed_by_cidr(host.host):  # a kubeconfig's proxy-url is already explicit
        try:
            proxy, proxy_auth = get_env_proxy_for_url(host)
        except LookupError:  # no proxy variable for the scheme, or NO_PROXY names the host
            pass
        else:
            # the session's default proxy, its credentials apart as aiohttp keeps them when it reads the
            # environment itself (sent as Proxy-Authorization, on the request for an http:// server and on
            # the CONNECT for an https:// one): in the URL they would be in every proxy error's message,
            # logged and shown in /readyz
            session._default_proxy = proxy
            session._default_proxy_auth = proxy_auth
            log.info("API server %s reached through the proxy %s (from the environment)",
                     api.configuration.host, proxy)
    session._trust_env = False


class Kube:
    def __init__(self, api: client.ApiClient):
        self.api = api
        self.server_clock = ServerClock()
        self.on_denied: list[Callable[[], None]] = []  # told of every 401/403 answer (shared/serving/access.py)
        self._best_effort = asyncio.Semaphore(BEST_EFFORT_IN_FLIGHT)
        self._best_effort_waiting = 0
        self._best_effort_after = 0.0  # (monotonic) a best-effort request answered 429 asked for none before this

    def denied(self) -> None:
        """A call was answered 401 or 403 (also a watch, or an ERROR event in its stream): tell on_denied."""
        for told in self.on_denied:
            told()

    @classmethod
    async def create(cls, kubeconfig: str = "") -> Kube:
        cfg = client.Configuration()
        if kubeconfig:
            await config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        else:
            config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        cfg.connection_pool_maxsize = 64
        api = client.ApiClient(configuration=cfg)
        _read_env_once(api)
        return cls(api)

    async def close(self) -> None:
        await self.api.close()

    async def raw(self, method: str, path: str, body: Any = None, query: Mapping[str, Any] | None = None,
                  timeout: float | aiohttp.ClientTimeout | None = 30.0,
                  content_type: str = "application/json", until: float | None = None) -> aiohttp.ClientResponse:
        """One request on the API client's session, with its authentication, proxy and TLS settings.

        What kubernetes-asyncio's `call_api` does for our calls, without its generic layers: every body here
        is a plain dict, encoded once with orjson (`call_api` walks it to sanitise it, then its REST client
        encodes it again with the stdlib's json), and the headers are built once per call. Measured by CPU-time
        sampling in a burst (`MTSCHED_BENCH_SAMPLE_WINDOW`, docs/benchmarks.md), those layers were ~3.5 % of
        the extender's CPU around each Binding. The token is still asked of the configuration on every call
        (`update_params_for_auth`), so a refreshed ServiceAccount token is used as before.

        `until` (a time.monotonic() instant): the API server must have abandoned the request by then. What is
        left of it once the request is ready to go is split between getting a connection (aiohttp's `connect`
        timeout: the pool's wait and a new connection's setup, BIND_CONNECT_S at most) and the API server's own
        deadline (its `timeout` parameter, counted from when it receives the request), so a write it has not
        committed by `until` it never commits. NotSent when too little is left: nothing was sent."""
        api = self.api
        rest = api.rest_client
        headers = {**api.default_headers, "Accept": "application/json", "Content-Type": content_type}
        if api.cookie:
            headers["Cookie"] = api.cookie
        await api.update_params_for_auth(headers, [], ["BearerToken"])
        url = f"{api.configuration.host}{path}"
        params = list((query or {}).items())
        extra: dict[str, Any] = {}
        if until is not None:
            left = until - time.monotonic()
            connect = min(BIND_CONNECT_S, left / 2)
            server_ms = int((left - connect) * 1000)
            if server_ms < SERVER_DEADLINE_MIN_MS:
                raise NotSent(f"{method} {path}: {max(left, 0.0):.2f}s left of its deadline, not sent")
            params.append(("timeout", f"{server_ms}ms"))
            timeout = aiohttp.ClientTimeout(total=left + BIND_ANSWER_SLACK_S, connect=connect)
            extra["allow_redirects"] = False  # a redirected request would go again, without the deadline
        if params:
            url += "?" + urlencode(params)
        if timeout is None:
            timeout = aiohttp.ClientTimeout()
        elif not isinstance(timeout, aiohttp.ClientTimeout):
            timeout = aiohttp.ClientTimeout(total=timeout)
        args: dict[str, Any] = {"headers": headers, "timeout": timeout, **extra}
        if body is not None:
            args["data"] = body if isinstance(body, bytes) else orjson.dumps(body)
        if rest.proxy:
            args["proxy"] = rest.proxy
        if rest.proxy_headers:
            args["proxy_headers"] = rest.proxy_headers
        if rest.server_hostname:
            args["server_hostname"] = rest.server_hostname
        resp: aiohttp.ClientResponse = await rest.pool_manager.request(method, url, **args)
        return resp

    async def request(self, method: str, path: str, body: Any = None, query: Mapping[str, Any] | None = None,
                      ok: tuple[int, ...] = (200, 201), content_type: str = "application/json",
                      timeout: float = 30.0, until: float | None = None, best_effort: bool = False,
                      patience: float = 0.0) -> Any:
        """The decoded answer (a JSON object for a 2xx: BadAnswer otherwise); KubeError for a status not in `ok`.
        `best_effort` (Events): sent when one of BEST_EFFORT_IN_FLIGHT turns is free, within BEST_EFFORT_TIMEOUT
        (Shed when too many wait already, or while a 429's Retry-After lasts: none is sent again).
        A 429 with Retry-After is sent again after that wait when it fits before `until`, or within `patience`
        seconds of waiting in all (a request without either is not: its caller's own retry honours it)."""
        if best_effort:
            if time.monotonic() < self._best_effort_after:  # the API server asked for none until then
                raise Shed(f"{method} {path}: the API server is throttling (429, Retry-After): not sent")
            if self._best_effort_waiting >= BEST_EFFORT_WAITING:
                raise Shed(f"{method} {path}: {BEST_EFFORT_WAITING} best-effort requests wait already: not sent")
            self._best_effort_waiting += 1
            try:
                await self._best_effort.acquire()
            finally:
                self._best_effort_waiting -= 1
            try:
                return await self._once(method, path, body, query, ok, content_type, min(timeout, BEST_EFFORT_TIMEOUT),
                                        until)
            except KubeError as e:
                if e.status == 429 and e.retry_after is not None:  # then not sent again, nor any other: shed
                    self._best_effort_after = max(self._best_effort_after, time.monotonic() + e.retry_after)
                raise
            finally:
                self._best_effort.release()
        # a 429 that says when is sent again then, if that fits: before `until` (with BIND_MIN_LEFT_S left to
        # send it in), or within `patience` seconds of waiting
        waited = 0.0
        while True:
            try:
                return await self._once(method, path, body, query, ok, content_type, timeout, until)
            except KubeError as e:
                left = (until - time.monotonic() - BIND_MIN_LEFT_S) if until is not None else patience - waited
                wait = wait_to_resend(e.status, e.retry_after, left)
                if wait is None:
                    raise
                log.debug("%s %s answered 429; sending it again in %.1fs as asked", method, path, wait)
                await asyncio.sleep(wait)
                waited += wait

    async def _once(self, method: str, path: str, body: Any, query: Mapping[str, Any] | None, ok: tuple[int, ...],
                    content_type: str, timeout: float, until: float | None) -> Any:
        resp = await self.raw(method, path, body, query, timeout=timeout, content_type=content_type, until=until)
        async with resp:
            data = await resp.read()
            self.server_clock.note(resp.headers.get("Date"))
            try:
                decoded = orjson.loads(data) if data else {}
            except orjson.JSONDecodeError:
                decoded = data.decode(errors="replace")
            if resp.status in ok and not isinstance(decoded, dict):
                raise BadAnswer(f"{method} {path}: HTTP {resp.status} with no JSON object in its body: "
                                f"{str(decoded)[:120]!r}")
            if resp.status not in ok:
                if resp.status in (401, 403):
                    self.denied()
                asked = retry_after_s(resp.headers.get("Retry-After"))
                raise KubeError(resp.status, decoded, f"{method} {path}",
                                status_retry_after(decoded) if asked is None else asked)
            return decoded

    # -- the few calls the roles make ----------------------------------------------------------

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        what = f"GET pod {namespace}/{name}"
        return _the_object(await self.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}",
                                              patience=READ_PATIENCE_S), "Pod", name, namespace, what)

    async def get_node(self, name: str) -> dict[str, Any]:
        return _the_object(await self.request("GET", f"/api/v1/nodes/{name}", patience=READ_PATIENCE_S),
                           "Node", name, None, f"GET node {name}")

    async def bind(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str],
                   until: float | None = None) -> None:
        """Create the Binding; its annotations are copied onto the pod in the same call by the API server,
        so a pod is never bound without its allocation record. The uid precondition stops a bind of
        a recreated pod with the same name. `until`: the API server commits it by then or never (raw)."""
        body = {"apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": name, "namespace": namespace, "uid": uid, "annotations": dict(annotations)},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        await self.request("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/binding", body, until=until)

    async def create_event(self, pod: Mapping[str, Any], reason: str, message: str, kind: str,
                           component: str) -> None:
        meta = pod.get("metadata") or {}
        ns = meta.get("namespace") or "default"
        from datetime import UTC, datetime

        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        # named after the pod, the reason and the message: the same event again (a condition that lasts, sent once
        # a minute; another replica; a restart) is refused (409) while the first is kept (the API server's event
        # TTL, an hour by default), not stored once more: with generateName a pod Pending for an hour left 60
        # identical Events (tests/e2e/test_redteam_flood_events.py)
        message = message[:1024]
        digest = hashlib.sha256(f"{meta.get('uid')}\0{reason}\0{kind}\0{message}\0{component}".encode()).hexdigest()
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{str(meta.get('name') or 'pod')[:200].rstrip('.-')}.{digest[:16]}",
                         "namespace": ns},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": meta.get("name"), "namespace": ns,
                               "uid": meta.get("uid")},
            "reason": reason, "message": message, "type": kind,
            "source": {"component": component}, "reportingComponent": component,
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        try:
            await self.request("POST", f"/api/v1/namespaces/{ns}/events", body, best_effort=True)
        except KubeError as e:
            if e.status != 409:  # 409: this very event is recorded already
                raise
