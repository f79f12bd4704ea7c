"""The three deployable roles as long-running asyncio programs: extender, webhook, watcher.

Each serves /healthz, /readyz and /metrics on `metricsListen` (plain HTTP, for probes and
Prometheus) and its own API on `listen` (HTTPS when a certificate is configured).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable

from aiohttp import web

from controller.extender import BODY_LIMIT as EXTENDER_BODY_LIMIT
from controller.extender import Extender
from controller.kube import Kube
from controller.reconciler import Reconciler
from controller.watchers import Janitor, NodeWatcher, PodWatcher
from shared.card_metrics import register_mirror
from shared.config import Config, redact_url
from shared.ledger import Ledger, RedisOptions, connect, connect_subscriber, explain
from shared.metrics import READY, metrics_handler
from shared.mirror import Mirror
from shared.supervise import Heartbeat, Supervisor, probe_loop
from shared.tls import CertReloader, watch_certs
from webhook.server import BODY_LIMIT as WEBHOOK_BODY_LIMIT
from webhook.server import Webhook

log = logging.getLogger("mtsched")


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port)


async def serve(app: web.Application, addr: str, ssl_context: ssl.SSLContext | None = None) -> web.AppRunner:
    from shared.listen import LISTEN_POLICY

    policy = app.get(LISTEN_POLICY)
    if policy is not None:  # the role's default address and client authentication (shared/listen.py)
        addr, ssl_context = policy.apply(addr, ssl_context)
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
        READY.set(0 if why else 1)
        return web.Response(text="ok" if not why else "not ready:\n" + "\n".join(why), status=503 if why else 200)

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_handler)
    return await serve(app, cfg.metrics_listen)


def tls(cfg: Config) -> CertReloader | None:
    return CertReloader(cfg.tls_cert_file, cfg.tls_key_file) if cfg.tls_cert_file else None


async def _ledger(cfg: Config, sup: Supervisor, card_metrics: bool = False) -> tuple[Ledger, Mirror]:
    options = RedisOptions.from_config(cfg)
    ledger = Ledger(connect(cfg.redis_url, options), cfg.key_prefix)
    backoff = 0.5
    while True:
        try:
            await ledger.load_scripts()
            break
        except Exception as e:
            # the URL may carry a password: only its redacted form is ever logged
            log.warning("Redis at %s not reachable (%s); retrying", redact_url(cfg.redis_url), explain(e))
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5)
    mirror = Mirror(ledger, subscriber=connect_subscriber(cfg.redis_url, options))
    sup.spawn("mirror", mirror.run)
    sup.check("mirror", lambda: "" if mirror.ready.is_set() else "not in sync with Redis")
    redis_ok = Heartbeat("Redis", max_age=6.0)
    sup.spawn("redis-probe", lambda: probe_loop(redis_ok, ledger.redis.ping))
    sup.check("redis", redis_ok)
    if card_metrics:
        # Per-card gauges come from the watchers only: at 1000 nodes they are ~9 MB per scrape, which
        # would stall the extender's and webhook's event loops for half a second each time.
        register_mirror(mirror)
    return ledger, mirror


async def _serve_api(cfg: Config, app: web.Application, sup: Supervisor, stop: asyncio.Event) -> bool:
    """Serve a role's API (HTTPS when configured) and its health/metrics until `stop` or a task gave up."""
    reloader = tls(cfg)
    runners = [await serve(app, cfg.listen, reloader.context if reloader else None),
               await serve_health(cfg, sup.problems)]
    if reloader is not None:
        sup.spawn("tls-reload", lambda: watch_certs(reloader))
    ok = await sup.run(stop)
    for r in runners:
        await r.cleanup()
    return ok


async def run_extender(cfg: Config, stop: asyncio.Event) -> bool:
    sup = Supervisor()
    ledger, mirror = await _ledger(cfg, sup)
    kube = await Kube.create(cfg.kubeconfig)
    app = web.Application(client_max_size=EXTENDER_BODY_LIMIT)
    Extender(cfg, ledger, mirror, kube).routes(app)
    ok = await _serve_api(cfg, app, sup, stop)
    await kube.close()
    return ok


async def run_webhook(cfg: Config, stop: asyncio.Event) -> bool:
    sup = Supervisor()
    _, mirror = await _ledger(cfg, sup)
    app = web.Application(client_max_size=WEBHOOK_BODY_LIMIT)
    Webhook(cfg, mirror.capacities).routes(app)
    # ready once the mirror knows the cards the cluster reports (the mixed-fleet default needs them)
    return await _serve_api(cfg, app, sup, stop)


async def run_watcher(cfg: Config, stop: asyncio.Event) -> bool:
    sup = Supervisor()
    ledger, mirror = await _ledger(cfg, sup, card_metrics=True)
    kube = await Kube.create(cfg.kubeconfig)
    nodes = NodeWatcher(kube, ledger, cfg)
    pods = PodWatcher(kube, ledger, mirror, cfg, nodes.lost)
    nodes.holders = pods.holders
    nodes.quarantine = pods.quarantine
    pods.inventories = lambda: nodes.last
    reconciler = Reconciler(kube, ledger, cfg, nodes, pods)
    pods.unaccounted_changed = reconciler.wake.set
    mirror.on_reconnect.append(reconciler.wake.set)  # Pub/Sub lost messages meanwhile: compare soon
    health = await serve_health(cfg, sup.problems)
    sup.check("nodes", nodes.reflector.problem)
    sup.check("pods", pods.reflector.problem)
    backoff = 0.5
    while not stop.is_set():
        try:
            await reconciler.rebuild()
            break
        except Exception as e:
            log.warning("initial rebuild failed (%s); retrying in %.1fs", e, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 10.0)
    sup.spawn("nodes", nodes.reflector.run)
    sup.spawn("pods", pods.reflector.run)
    sup.spawn("reconciler", reconciler.run)
    sup.spawn("janitor", Janitor(ledger, mirror, cfg, nudger=pods.nudger).run)
    ok = await sup.run(stop)
    await health.cleanup()
    await kube.close()
    return ok
