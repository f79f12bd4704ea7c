"""The webhook role as a long-running program: admission over HTTPS, ready once its mirror is in sync."""

from __future__ import annotations

import asyncio

from aiohttp import web

from shared.config import Config
from shared.kube import Kube
from shared.serving.access import watch_access
from shared.serving.http import serve_api
from shared.serving.supervise import Supervisor
from shared.store.session import start_role
from webhook.quotas import QuotaReader
from webhook.server import BODY_LIMIT, Webhook


async def run_webhook(cfg: Config, stop: asyncio.Event) -> bool:
    sup = Supervisor()
    # the webhook reads card capacities and node errors only: bookings are not decoded (Mirror.shapes_only)
    health, _, mirror = await start_role(cfg, sup, stop, shapes_only=True)
    # the quota check reads ResourceQuotas and pods (webhook/quotas.py); without it no API calls
    kube = await Kube.create(cfg.kubeconfig) if cfg.quota_check else None
    if kube is not None:
        watch_access(sup, kube, "webhook")
    app = web.Application(client_max_size=BODY_LIMIT)
    Webhook(cfg, mirror.capacities, QuotaReader(kube, cfg) if kube else None, mirror.mismatched).routes(app)
    # ready once the mirror knows the cards the cluster reports (the mixed-fleet default needs them)
    try:
        return await serve_api(cfg, app, sup, stop, health)
    finally:
        if kube:
            await kube.close()
