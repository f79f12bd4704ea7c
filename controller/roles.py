"""The three deployable roles as long-running asyncio programs: extender, webhook, watcher.

Each serves /healthz, /readyz and /metrics on `metricsListen` (plain HTTP, for probes and
Prometheus) and its own API on `listen` (HTTPS when a certificate is configured).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable

from aiohttp import web

from controller.extender import Extender
from controller.kube import Kube
from controller.watchers import Janitor, NodeWatcher, PodWatcher, Rebuilder
from shared.config import Config
from shared.ledger import Ledger, connect
from shared.metrics import metrics_handler, register_mirror
from shared.mirror import Mirror
from webhook.server import CertReloader, Webhook

log = logging.getLogger("mtsched")


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port)


async def serve(app: web.Application, addr: str, ssl_context: ssl.SSLContext | None = None) -> web.AppRunner:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    host, port = split_addr(addr)
    await web.TCPSite(runner, host, port, ssl_context=ssl_context, backlog=1024).start()
    log.info("listening on %s://%s", "https" if ssl_context else "http", addr)
    return runner


async def serve_health(cfg: Config, ready: Callable[[], bool]) -> web.AppRunner:
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        ok = ready()
        return web.Response(text="ok" if ok else "not ready", status=200 if ok else 503)

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_handler)
    return await serve(app, cfg.metrics_listen)


def tls(cfg: Config) -> CertReloader | None:
    return CertReloader(cfg.tls_cert_file, cfg.tls_key_file) if cfg.tls_cert_file else None


async def watch_certs(reloader: CertReloader | None) -> None:
    while reloader is not None:
        await asyncio.sleep(10)
        try:
            reloader.maybe_reload()
        except (OSError, ssl.SSLError) as e:
            log.error("TLS certificate reload failed, keeping the previous one: %s", e)


async def _ledger(cfg: Config, card_metrics: bool = False) -> tuple[Ledger, Mirror]:
    ledger = Ledger(connect(cfg.redis_url), cfg.key_prefix)
    backoff = 0.5
    while True:
        try:
            await ledger.load_scripts()
            break
        except Exception as e:
            log.warning("Redis at %s not reachable (%s); retrying", cfg.redis_url, e)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5)
    mirror = Mirror(ledger, subscriber=connect(cfg.redis_url))
    await mirror.start()
    if card_metrics:
        # Per-card gauges come from the watchers only: at 1000 nodes they are ~9 MB per scrape, which
        # would stall the extender's and webhook's event loops for half a second each time.
        register_mirror(mirror)
    return ledger, mirror


async def _serve_api(cfg: Config, app: web.Application, ready: Callable[[], bool], stop: asyncio.Event) -> None:
    """Serve a role's API (HTTPS when configured) and its health/metrics until `stop`."""
    reloader = tls(cfg)
    runners = [await serve(app, cfg.listen, reloader.context if reloader else None), await serve_health(cfg, ready)]
    certs = asyncio.create_task(watch_certs(reloader))
    await stop.wait()
    certs.cancel()
    for r in runners:
        await r.cleanup()


async def run_extender(cfg: Config, stop: asyncio.Event) -> None:
    ledger, mirror = await _ledger(cfg)
    kube = await Kube.create(cfg.kubeconfig)
    app = web.Application(client_max_size=32 * 1024 * 1024)  # ExtenderArgs with a whole NodeList
    Extender(cfg, ledger, mirror, kube).routes(app)
    await _serve_api(cfg, app, mirror.ready.is_set, stop)
    await mirror.stop()
    await kube.close()


async def run_webhook(cfg: Config, stop: asyncio.Event) -> None:
    _, mirror = await _ledger(cfg)
    app = web.Application(client_max_size=8 * 1024 * 1024)
    Webhook(cfg, mirror.capacities).routes(app)
    # ready once the mirror knows the cards the cluster reports (the mixed-fleet default needs them)
    await _serve_api(cfg, app, mirror.ready.is_set, stop)
    await mirror.stop()


async def run_watcher(cfg: Config, stop: asyncio.Event) -> None:
    ledger, mirror = await _ledger(cfg, card_metrics=True)
    kube = await Kube.create(cfg.kubeconfig)
    nodes = NodeWatcher(kube, ledger, cfg)
    pods = PodWatcher(kube, ledger, mirror, cfg, nodes.lost)
    rebuilder = Rebuilder(ledger, cfg, nodes, pods)
    while True:
        try:
            await rebuilder.rebuild()
            break
        except Exception as e:
            log.warning("initial rebuild failed (%s); retrying", e)
            await asyncio.sleep(1)
    health = await serve_health(cfg, lambda: nodes.reflector.synced.is_set() and pods.reflector.synced.is_set())
    tasks = [asyncio.create_task(c, name=n) for n, c in (
        ("nodes", nodes.reflector.run()), ("pods", pods.reflector.run()), ("rebuilder", rebuilder.run()),
        ("janitor", Janitor(ledger, mirror, cfg, nudger=pods.nudger).run()))]
    await stop.wait()
    for t in tasks:
        t.cancel()
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await t
    await health.cleanup()
    await mirror.stop()
    await kube.close()
