"""The webhook role as a long-running program: admission over HTTPS, ready once its mirror is in sync."""

from __future__ import annotations

import asyncio

from aiohttp import web

from controller.kube import Kube
from shared.config import Config
from shared.serving.http import serve_api
from shared.serving.supervise import Supervisor
from shared.store.session import open_ledger
from webhook.quotas import QuotaReader
from webhook.server import BODY_LIMIT, Webhook


async def run_webhook(cfg: Config, stop: asyncio.Event) -> bool:
    sup = Supervisor()
    _, mirror = await open_ledger(cfg, sup)
    kube = await Kube.create(cfg.kubeconfig)  # reads ResourceQuotas and pods for the quota check
    app = web.Application(client_max_size=BODY_LIMIT)
    Webhook(cfg, mirror.capacities, QuotaReader(kube, cfg)).routes(app)
    # ready once the mirror knows the cards the cluster reports (the mixed-fleet default needs them)
    try:
        return await serve_api(cfg, app, sup, stop)
    finally:
        await kube.close()
