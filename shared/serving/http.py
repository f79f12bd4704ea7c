"""How every role serves: its API on `listen` (HTTPS when a certificate is configured) and
/healthz, /readyz and /metrics on `metricsListen` (plain HTTP, for probes and Prometheus)."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable

from aiohttp import web

from shared.config import Config
from shared.serving.listen import LISTEN_POLICY
from shared.serving.metrics import READY, metrics_handler
from shared.serving.supervise import Supervisor
from shared.serving.tls import CertReloader, watch_certs

log = logging.getLogger("mtsched")


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port)


async def serve(app: web.Application, addr: str, ssl_context: ssl.SSLContext | None = None) -> web.AppRunner:
    policy = app.get(LISTEN_POLICY)
    if policy is not None:  # the role's default address and client authentication (shared/serving/listen.py)
        addr, ssl_context = policy.apply(addr, ssl_context)
        if (names := policy.middleware()) is not None:
            app.middlewares.append(names)  # before the runner's setup freezes the application
    runner = web.AppRunner(app, access_log=None)
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
