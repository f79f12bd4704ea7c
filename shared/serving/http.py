"""How every role serves: its API on `listen` (HTTPS when a certificate is configured) and
/healthz, /readyz and /metrics on `metricsListen` (plain HTTP, for probes and Prometheus)."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from typing import Any

from aiohttp import hdrs, web
from aiohttp.web_protocol import RequestPayloadError

from shared.config import Config
from shared.serving.listen import LISTEN_POLICY
from shared.serving.metrics import CONNECTIONS_REFUSED, READY, metrics_handler
from shared.serving.supervise import Supervisor
from shared.serving.tls import CertReloader, watch_certs

log = logging.getLogger("mtsched")


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port)


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


class BodyError(Exception):
    """A request body that cannot be read: its HTTP status and a message naming what is wrong."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


async def read_body(request: web.Request) -> bytes:
    """The request's body, in bounded time. BodyError: compressed (415: no caller of ours compresses, and an
    uncompressed body is what client_max_size bounds), not received within BODY_SECONDS (408), or cut short
    or malformed in its framing (400). A body over client_max_size still raises aiohttp's 413."""
    encoding = request.headers.get(hdrs.CONTENT_ENCODING, "")
    if encoding.strip().lower() not in ("", "identity"):
        raise BodyError(415, f"Content-Encoding: got {encoding[:40]!r}; allowed: none (send the body uncompressed)")
    try:
        async with asyncio.timeout(BODY_SECONDS):
            return await request.read()
    except TimeoutError:
        raise BodyError(408, f"body: not received within {BODY_SECONDS:g} s") from None
    except RequestPayloadError as e:
        raise BodyError(400, f"body: cannot be read ({str(e)[:200]})") from None


class _Refused(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        CONNECTIONS_REFUSED.inc()
        if isinstance(transport, asyncio.Transport):
            transport.abort()
        else:
            transport.close()


class _CappedServer(web.Server):
    """aiohttp's connection factory, refusing connections past MAX_CONNECTIONS open at once."""

    def __call__(self) -> Any:
        if len(self.connections) >= MAX_CONNECTIONS:
            return _Refused()
        return super().__call__()


class _Runner(web.AppRunner):
    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _CappedServer  # the same object, one method more (aiohttp builds it privately)
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
    await web.TCPSite(runner, host, port, ssl_context=ssl_context, backlog=1024).start()
    log.info("listening on %s://%s", "https" if ssl_context else "http", addr)
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
    ok = await sup.run(stop)
    for r in runners:
        await r.cleanup()
    return ok
