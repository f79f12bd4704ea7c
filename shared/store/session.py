"""A role's supervised connection to the shared state: the Ledger, its Mirror and the Redis probe."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from aiohttp import web
from redis import exceptions as rexc

from shared.config import Config, redact_url
from shared.serving import gc_policy
from shared.serving.http import serve_health
from shared.serving.metrics import REDIS_UP
from shared.serving.supervise import Backoff, Heartbeat, Supervisor, probe_loop
from shared.store.card_metrics import register_mirror
from shared.store.ledger import Ledger
from shared.store.ledger_core import AclRefusedError
from shared.store.mirror import Mirror
from shared.store.redis_conn import RedisOptions, acl_refused, connect, connect_subscriber, credentials_refused, explain

log = logging.getLogger("mtsched")
T = TypeVar("T")


def _said(work: Callable[[], Awaitable[T]]) -> Callable[[], Awaitable[T]]:
    """`work`, a refusal of the Redis user's ACL raised as an AclRefusedError that says what to grant (explain):
    what the role's readiness and log then show. Every round trip of the ledger says so already (LedgerCore._retry);
    this is for what is sent outside it: the mirror's SUBSCRIBE, and the readiness probe's write (sent once a
    probe, never again: a failed probe is the answer). Credentials refused once running (the password rotated in
    Redis, and the role, which read its own at its start, connecting again) are said as at the start, with what to
    check (still an AuthenticationError: a connection error, retried for as long as it lasts)."""
    async def run() -> T:
        try:
            return await work()
        except Exception as e:
            if acl_refused(e) and not isinstance(e, AclRefusedError):
                raise AclRefusedError(explain(e)) from e
            if credentials_refused(e) and isinstance(e, rexc.AuthenticationError):
                raise rexc.AuthenticationError(explain(e)) from e
            raise
    return run


def _settle() -> None:
    frozen = gc_policy.settle()
    log.info("state loaded: %d objects frozen out of later garbage collections", frozen)


async def open_ledger(cfg: Config, sup: Supervisor, card_metrics: bool = False,
                      stop: asyncio.Event | None = None, shapes_only: bool = False) -> tuple[Ledger, Mirror]:
    """Connect (retrying until Redis answers, or Stopped once `stop` is set), then keep the mirror and the
    PING probe under `sup`. Meanwhile the role is not ready, and says why (its health port serves already).
    `shapes_only`: the role reads only the mirror's card capacities and node errors (Mirror), which change with
    nodes, not bookings: it serves from what it loaded, so once in sync it stays ready while Redis is away (the
    webhook: its replicas unready would refuse every slice pod's creation, failurePolicy Fail)."""
    options = RedisOptions.from_config(cfg)
    ledger = Ledger(connect(cfg.redis_url, options), cfg.key_prefix)
    backoff = Backoff(0.5, 5.0)
    waiting = "not connected yet"
    sup.check("redis", lambda: f"Redis: {waiting}")
    while True:
        try:
            await ledger.load_scripts()
            break
        except Exception as e:
            # the URL may carry a password: only its redacted form is ever logged
            how = "refuses this user what the roles need" if acl_refused(e) else "not reachable"
            waiting = f"{how} at {redact_url(cfg.redis_url)} ({explain(e)})"
            log.warning("Redis at %s %s (%s); retrying", redact_url(cfg.redis_url), how, explain(e))
            await backoff.sleep(stop)
    mirror = Mirror(ledger, subscriber=connect_subscriber(cfg.redis_url, options), shapes_only=shapes_only)
    # the cards loaded: freeze them (and everything else alive) out of later garbage collections
    mirror.on_first_sync.append(_settle)
    sup.spawn("mirror", _said(mirror.run))
    sup.spawn("gc-settle", gc_policy.settle_when_grown)  # state that arrives later (a fleet that grows)
    redis_ok = Heartbeat("Redis", max_age=6.0)
    sup.spawn("redis-probe", lambda: probe_loop(redis_ok, _said(ledger.probe_write)))  # a write, not a PING
    if shapes_only:
        sup.check("mirror", lambda: "" if mirror.synced_once else "not in sync with Redis yet")
        sup.check("redis", lambda: "" if mirror.synced_once else redis_ok())
    else:
        sup.check("mirror", lambda: "" if mirror.ready.is_set() else "not in sync with Redis")
        sup.check("redis", redis_ok)
    REDIS_UP.set_function(lambda: 0.0 if redis_ok() else 1.0)
    if card_metrics:
        # Per-card gauges come from the watchers only: at 1000 nodes they are ~9 MB per scrape, which
        # would stall the extender's and webhook's event loops for half a second each time.
        register_mirror(mirror)
    return ledger, mirror


async def start_role(cfg: Config, sup: Supervisor, stop: asyncio.Event, card_metrics: bool = False,
                     shapes_only: bool = False) -> tuple[web.AppRunner, Ledger, Mirror]:
    """Every role's start: its probes served first (alive, and not ready while Redis does not answer), then
    the ledger (open_ledger, Stopped by SIGTERM meanwhile). The caller stops the health runner at the end."""
    health = await serve_health(cfg, sup.problems)
    try:
        ledger, mirror = await open_ledger(cfg, sup, card_metrics, stop, shapes_only)
    except BaseException:
        await health.cleanup()
        raise
    return health, ledger, mirror
