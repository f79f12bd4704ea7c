"""How every role serves: its API on `listen` (HTTPS when a certificate is configured) and
/healthz, /readyz and /metrics on `metricsListen` (plain HTTP, for probes and Prometheus)."""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import socket
import ssl
from collections import Counter
from collections.abc import Callable
from typing import Any, cast

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler
from aiohttp.web_protocol import RequestPayloadError

from shared.config import Config
from shared.serving.listen import LISTEN_POLICY
from shared.serving.metrics import BODIES_REFUSED, CONNECTIONS_REFUSED, READY, metrics_handler
from shared.serving.supervise import Supervisor
from shared.serving.tls import CertReloader, watch_certs

log = logging.getLogger("mtsched")


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port)


def join_addr(host: object, port: object) -> str:
    """split_addr's inverse: an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


# An unspecified address means every address of both families, as Go's net.Listen reads it and so every
# Kubernetes component's --bind-address: the kubelet's probes and the API server reach a pod at its IPv6 address
# in an IPv6 or IPv6-first cluster, which a Python socket on 0.0.0.0 (IPv4 only) never answers.
ANY_HOSTS = ("", "0.0.0.0", "::")
# A family this host cannot serve (IPv6 disabled in the kernel): skipped, when the other one listens.
MISSING_FAMILY = frozenset({errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL, errno.EPROTONOSUPPORT})


def listen_sockets(host: str, port: int, backlog: int) -> list[socket.socket]:
    """The listening sockets for `host`: one, or for an unspecified address one per family the host has
    (IPv4 and IPv6, each on its own, so an IPv4 peer is seen as itself), on one port (with port 0: the
    first's). Raises the bind error, e.g. the port in use, whatever the family."""
    if host not in ANY_HOSTS:
        return [socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET,
                                     backlog=backlog)]
    socks: list[socket.socket] = []
    missing: list[OSError] = []
    for family, any_host in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            socks.append(socket.create_server((any_host, port), family=family, backlog=backlog))
        except OSError as e:
            if e.errno not in MISSING_FAMILY:
                for s in socks:
                    s.close()
                raise
            missing.append(e)
            continue
        port = port or socks[0].getsockname()[1]
    if not socks:
        raise missing[0]
    return socks


# What a caller may hold of a server, whoever it is (every port: the API, probes and metrics).
# A connection's idle time, before its first request or between two: aiohttp's keep-alive timer, which also
# ends one whose request line or headers never finish. Above the 90 s after which Go's HTTP clients (the API
# server calling the webhook, kube-scheduler the extender) close an idle connection themselves, so they never
# send a POST on a connection the server is closing.
IDLE_SECONDS = 120.0
# The time a handler waits for the body once the headers came (read_body): the API server waits 30 s at most
# for a webhook, and a body on loopback or a cluster network takes milliseconds.
BODY_SECONDS = 10.0
# Connections open at once, per port; more are closed as they are accepted (each holds ~11 KiB, more with
# TLS): a flood of idle connections is refused rather than growing the role out of its memory limit.
MAX_CONNECTIONS = 1024
# ... and from one peer address: one caller cannot take them all from the others (the kubelet's probes, the
# API server). Well above what a legitimate caller holds: the API server keeps up to 25 idle connections to a
# webhook and opens more only while that many reviews are in flight; kube-scheduler ~20 in a burst of binds.
MAX_PER_PEER = 256


class BodyError(Exception):
    """A request body that cannot be read: its HTTP status and a message naming what is wrong."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


# What a body may take of the process's memory once read and decoded (json_cost): the body, aiohttp's copy of it,
# and orjson's peak while decoding, up to 13 bytes a byte for a long string (16 beyond Latin-1) and every value (one
# follows each "[", "{", ",", ":") up to ~140 bytes: 8 MB of `[],` are 2.7 million lists, +240 MiB
# (tests/unit/test_redteam_http_body_budget.py measures the bound).
JSON_BYTE_COST = 20
JSON_VALUE_COST = 160
JSON_BASE_COST = 8 * 1024


def json_cost(body: bytes) -> int:
    """An upper bound of the bytes `body`, aiohttp's copy of it and decoding it with orjson take at once (pure;
    four passes in C, ~1 ms a MiB)."""
    values = body.count(b"[") + body.count(b"{") + body.count(b",") + body.count(b":") + 1
    return JSON_BASE_COST + JSON_BYTE_COST * len(body) + JSON_VALUE_COST * values


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


class BodyBudget:
    """What the bodies of the requests being handled, and decoding them, may hold at once in one server (`limit`),
    and of that what the requests of one peer address may (`per_peer`): each body is charged JSON_BYTE_COST a byte
    as it comes, then the rest of its json_cost before it is decoded, until its handler ends (the middleware). A
    body that could never fit a peer's share is refused 413, one past what is left 503 (Retry-After): never a
    process out of its memory limit. An application opts in with app[BODY_BUDGET] and the middleware (read_body)."""

    def __init__(self, limit: int, per_peer: int) -> None:
        self.limit, self.per_peer = limit, per_peer
        self.held = 0
        self.peers: Counter[str] = Counter()

    def held_by(self, peer: str) -> int:
        return self.peers[peer]

    def fits(self, cost: int) -> None:
        """BodyError 413 when one request costing `cost` could never be held."""
        if cost > self.per_peer:
            raise BodyError(413, f"body: reading and decoding it takes up to {mib(cost)} (json_cost), more than "
                                 f"one caller may hold ({mib(self.per_peer)}); send a smaller body")

    def charge(self, request: web.Request, cost: int) -> None:
        """Charge `cost` more to `request` (held until its handler ends); BodyError when it does not fit."""
        peer = request.remote or ""
        mine = request.get(_CHARGED, 0) + cost
        self.fits(mine)
        if self.held + cost > self.limit or self.peers[peer] + cost > self.per_peer:
            BODIES_REFUSED.inc()
            raise BodyError(503, f"body: the bodies being handled hold {mib(self.held)} of {mib(self.limit)}, "
                                 f"{mib(self.peers[peer])} of them yours (at most {mib(self.per_peer)}); this one "
                                 f"needs {mib(cost)} more: retry", {"Retry-After": "1"})
        self.held += cost
        self.peers[peer] += cost
        request[_CHARGED] = mine

    def give_back(self, request: web.Request) -> None:
        cost = request.pop(_CHARGED, 0)
        if not cost:
            return
        peer = request.remote or ""
        self.held -= cost
        self.peers[peer] -= cost
        if self.peers[peer] <= 0:
            del self.peers[peer]

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        finally:  # answered, failed or cancelled: the body and what decoding it made are gone
            self.give_back(request)

    def install(self, app: web.Application) -> None:
        app[BODY_BUDGET] = self
        app.middlewares.append(self.middleware)


BODY_BUDGET = web.AppKey("mtsched_body_budget", BodyBudget)
_CHARGED = web.RequestKey("mtsched_body_charged", int)  # what a request holds of its application's budget


async def _read_charged(request: web.Request, budget: BodyBudget) -> bytes:
    """aiohttp's request.read(), charging each chunk as it comes, then the rest of the body's json_cost."""
    if request.content_length is not None:  # what could never fit is refused before a byte of it is read
        budget.fits(JSON_BYTE_COST * request.content_length)
    body = bytearray()
    while chunk := await request.content.readany():
        budget.charge(request, JSON_BYTE_COST * len(chunk))
        body.extend(chunk)
        if len(body) > request.client_max_size:
            raise web.HTTPRequestEntityTooLarge(max_size=request.client_max_size, actual_size=len(body))
    out = bytes(body)
    budget.charge(request, json_cost(out) - JSON_BYTE_COST * len(out))
    return out


async def read_body(request: web.Request) -> bytes:
    """The request's body, in bounded time. BodyError: compressed (415: no caller of ours compresses, and an
    uncompressed body is what client_max_size bounds), not received within BODY_SECONDS (408), or cut short
    or malformed in its framing (400); with a BodyBudget, one that could never fit a caller's share (413) or does
    not fit what is left (503). A body over client_max_size still raises aiohttp's 413."""
    for encoding in request.headers.getall(hdrs.CONTENT_ENCODING, []):
        if encoding.strip().lower() not in ("", "identity"):
            raise BodyError(415, f"Content-Encoding: got {encoding[:40]!r}; allowed: none (send the body "
                                 "uncompressed)")
    for coding in request.headers.getall(hdrs.TRANSFER_ENCODING, []):
        if any(c.strip().lower() not in ("chunked", "") for c in coding.split(",")):
            raise BodyError(415, f"Transfer-Encoding: got {coding[:40]!r}; allowed: chunked")
    budget = request.config_dict.get(BODY_BUDGET)
    try:
        async with asyncio.timeout(BODY_SECONDS):
            return await (request.read() if budget is None else _read_charged(request, budget))
    except web.HTTPRequestEntityTooLarge as e:  # aiohttp's text names both sizes
        raise BodyError(413, f"body: too large ({e.text}); send at most that many bytes") from None
    except TimeoutError:
        raise BodyError(408, f"body: not received within {BODY_SECONDS:g} s") from None
    except RequestPayloadError as e:
        raise BodyError(400, f"body: cannot be read ({str(e)[:200]})") from None
    except ConnectionError:  # the caller went before its body came: nobody reads the answer, nothing is logged
        raise BodyError(400, "body: the connection closed before the body came") from None


def _abort(transport: asyncio.BaseTransport) -> None:
    # uvloop's transports are no asyncio.Transport instances: duck-typed
    abort = getattr(transport, "abort", None)
    (abort or transport.close)()


class _Refused(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        CONNECTIONS_REFUSED.inc()
        _abort(transport)


def peer_of(transport: asyncio.BaseTransport) -> str:
    """The peer's address (host only), or "" when the transport does not say."""
    peer = transport.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) and peer else ""


class _CappedServer(web.Server):
    """aiohttp's connection factory, refusing connections past MAX_CONNECTIONS open at once, and past
    MAX_PER_PEER from one peer address (closed as they are made)."""

    peers: Counter[str]  # connections open from each peer address
    peer_of_handler: dict[Any, str]  # (RequestHandler has __slots__: the peer is kept here)

    def __call__(self) -> Any:
        if len(self.connections) >= MAX_CONNECTIONS:
            return _Refused()
        return super().__call__()

    def connection_made(self, handler: Any, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        peer = peer_of(transport)
        self.peers[peer] += 1
        self.peer_of_handler[handler] = peer
        if peer and self.peers[peer] > MAX_PER_PEER:
            CONNECTIONS_REFUSED.inc()
            _abort(transport)

    def connection_lost(self, handler: Any, exc: BaseException | None = None) -> None:
        super().connection_lost(handler, exc)
        # counted while aiohttp counts it: a handler still running after its peer left stays in `connections`
        # (and in the cap) until it ends, so it stays in its peer's count too
        task = getattr(handler, "_task_handler", None)
        if task is not None and not task.done():
            task.add_done_callback(lambda _: self._forget(handler))
        else:
            self._forget(handler)

    def _forget(self, handler: Any) -> None:
        peer = self.peer_of_handler.pop(handler, None)  # counted once, whatever calls this again
        if peer is not None:
            self.peers[peer] -= 1
            if self.peers[peer] <= 0:
                del self.peers[peer]


# The longest a TLS handshake may take before its connection is closed (asyncio's default is 60 s).
HANDSHAKE_SECONDS = 10.0


class _Listening:
    """The listening socket of a _TLSSite, as aiohttp's runner reads a site's server (`sockets`, `close`)."""

    def __init__(self, socks: list[socket.socket]) -> None:
        self.sockets = socks

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()


class _TLSSite(web.BaseSite):
    """aiohttp's TCP site for a TLS port, accepting connections itself: each is counted from its accept,
    handshake included, so past the cap it is closed before any TLS state is made (a flood of connections that
    never start TLS is refused, not held for asyncio's 60-s handshake timeout); the handshake is bounded
    (HANDSHAKE_SECONDS); a connection that completes it is aiohttp's, as on its own site."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, ssl_context: ssl.SSLContext) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=1024)
        self._host, self._port = host, port
        # each connection whose TLS is not up yet, and the handler made for it (once the handshake is done)
        self.handshaking: dict[asyncio.Task[None], list[asyncio.BaseProtocol]] = {}
        self.shaking_peers: Counter[str] = Counter()  # of those, how many from each peer address
        self._accepting: list[asyncio.Task[None]] = []

    @property
    def name(self) -> str:
        return f"https://{self._host}:{self._port}"

    def open(self) -> int:
        """Connections open: aiohttp's (TLS up), and those in their handshake (a handler that has its
        transport is aiohttp's already, while its task ends)."""
        server = self._runner.server
        shaking = sum(1 for made in self.handshaking.values() if not made or getattr(made[0], "transport", 1) is None)
        return shaking + (len(server.connections) if server is not None else 0)

    async def start(self) -> None:
        await super().start()
        socks = listen_sockets(self._host, self._port, self._backlog)
        for sock in socks:
            sock.setblocking(False)
        self._server = cast(asyncio.AbstractServer, _Listening(socks))
        loop = asyncio.get_running_loop()
        self._accepting = [loop.create_task(self._accept(sock)) for sock in socks]

    async def stop(self) -> None:
        for accepting in self._accepting:
            accepting.cancel()
        for task in list(self.handshaking.keys()):
            task.cancel()
        await super().stop()  # closes the socket

    async def _accept(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, addr = await loop.sock_accept(sock)
            except OSError as e:  # out of descriptors, a connection reset while queued: go on, a breath later
                log.warning("accept failed on %s: %s", self.name, e)
                await asyncio.sleep(0.1)
                continue
            except Exception:  # anything else (memory, a bug): never an open port that accepts nothing
                log.exception("accept failed on %s", self.name)
                await asyncio.sleep(0.1)
                continue
            try:
                peer = str(addr[0]) if isinstance(addr, tuple) and addr else ""
                server = self._runner.server
                held = self.shaking_peers[peer] + (server.peers[peer] if isinstance(server, _CappedServer) else 0)
                if self.open() >= MAX_CONNECTIONS or (peer and held >= MAX_PER_PEER):
                    CONNECTIONS_REFUSED.inc()
                    conn.close()
                    continue
                made: list[asyncio.BaseProtocol] = []
                task = loop.create_task(self._handshake(conn, made))
                self.handshaking[task] = made
                self.shaking_peers[peer] += 1
                task.add_done_callback(functools.partial(self._shaken, peer))
            except Exception:
                log.exception("cannot take a connection on %s", self.name)
                conn.close()

    def _shaken(self, peer: str, task: asyncio.Task[None]) -> None:
        self.handshaking.pop(task, None)
        self.shaking_peers[peer] -= 1
        if self.shaking_peers[peer] <= 0:
            del self.shaking_peers[peer]

    async def _handshake(self, conn: socket.socket, made: list[asyncio.BaseProtocol]) -> None:
        server = self._runner.server
        if server is None:
            conn.close()
            return

        def handler() -> asyncio.BaseProtocol:
            made.append(server())  # aiohttp's handler, or _Refused past the cap
            return made[0]

        try:
            # the handler gets connection_made once TLS is up
            await asyncio.get_running_loop().connect_accepted_socket(
                handler, conn, ssl=self._ssl_context, ssl_handshake_timeout=HANDSHAKE_SECONDS)
        except (OSError, ssl.SSLError, TimeoutError) as e:  # ConnectionError is an OSError
            log.debug("TLS handshake not completed on %s: %s", self.name, e)
            conn.close()
        except asyncio.CancelledError:
            conn.close()
            raise
        except Exception:  # never a socket left open by a failure nobody expected
            log.exception("TLS handshake failed on %s", self.name)
            conn.close()


class _Runner(web.AppRunner):
    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _CappedServer  # the same object, a few methods more (aiohttp builds it privately)
        cast(_CappedServer, server).peers = Counter()
        cast(_CappedServer, server).peer_of_handler = {}
        return server


async def serve(app: web.Application, addr: str, ssl_context: ssl.SSLContext | None = None) -> web.AppRunner:
    policy = app.get(LISTEN_POLICY)
    if policy is not None:  # the role's default address and client authentication (shared/serving/listen.py)
        addr, ssl_context = policy.apply(addr, ssl_context)
        if (names := policy.middleware()) is not None:
            app.middlewares.append(names)  # before the runner's setup freezes the application
    # auto_decompress off: a compressed body is refused (read_body), never inflated
    runner = _Runner(app, access_log=None, keepalive_timeout=IDLE_SECONDS, auto_decompress=False)
    await runner.setup()
    host, port = split_addr(addr)
    if ssl_context is not None:
        await _TLSSite(runner, host, port, ssl_context).start()
    elif host in ANY_HOSTS:
        for sock in listen_sockets(host, port, backlog=1024):
            await web.SockSite(runner, sock, backlog=1024).start()
    else:
        await web.TCPSite(runner, host, port, backlog=1024).start()
    log.info("listening on %s://%s (%s)", "https" if ssl_context else "http", addr,
             ", ".join(join_addr(a[0], a[1]) for a in runner.addresses))
    return runner


async def serve_health(cfg: Config, problems: Callable[[], list[str]]) -> web.AppRunner:
    """/healthz (the process serves), /readyz (the role can do its job now, else 503 with why), /metrics."""
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        why = problems()
        return web.Response(text="ok" if not why else "not ready:\n" + "\n".join(why), status=503 if why else 200)

    READY.set_function(lambda: 0.0 if problems() else 1.0)  # live at every scrape, probed or not
    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_handler)
    return await serve(app, cfg.metrics_listen)


def tls(cfg: Config) -> CertReloader | None:
    return CertReloader(cfg.tls_cert_file, cfg.tls_key_file) if cfg.tls_cert_file else None


async def serve_api(cfg: Config, app: web.Application, sup: Supervisor, stop: asyncio.Event,
                    health: web.AppRunner) -> bool:
    """Serve a role's API until `stop` or a task gave up (False when one gave up), then stop it and `health`
    (serve_health's, started first so that probes are answered while the role waits for Redis)."""
    reloader = tls(cfg)
    runners = [await serve(app, cfg.listen, reloader.context if reloader else None), health]
    if reloader is not None:
        sup.spawn("tls-reload", lambda: watch_certs(reloader))
        sup.check("tls", reloader.problem)  # the certificate served expired: every caller refuses the handshake
        policy = app.get(LISTEN_POLICY)
        if policy is not None and (ca_check := policy.client_ca_check()) is not None:
            sup.check("client-ca", ca_check)  # every client CA expired: the handshake refuses every caller
    ok = await sup.run(stop)
    for r in runners:
        await r.cleanup()
    return ok
