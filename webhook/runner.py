"""The webhook role as a long-running program: admission over HTTPS, ready once its mirror is in sync."""

from __future__ import annotations

import asyncio

from aiohttp import web

from shared.config import Config
from shared.serving.http import serve_api
from shared.serving.supervise import Supervisor
from shared.store.session import open_ledger
from webhook.server import BODY_LIMIT, Webhook


async def run_webhook(cfg: Config, stop: asyncio.Event) -> bool:
    sup = Supervisor()
    _, mirror = await open_ledger(cfg, sup)
    app = web.Application(client_max_size=BODY_LIMIT)
    Webhook(cfg, mirror.capacities, mirror.mismatched).routes(app)
    # ready once the mirror knows the cards the cluster reports (the mixed-fleet default needs them)
    return await serve_api(cfg, app, sup, stop)
