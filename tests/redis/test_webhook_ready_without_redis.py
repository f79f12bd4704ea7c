"""A role that serves card shapes from memory (the webhook: capacities and node errors, which change with nodes,
not bookings) stays ready while Redis is away once it has loaded them; a role that books (the extender, the
watchers) goes unready. Before, every webhook replica left its Service 6-16 s into a Redis restart, and with
failurePolicy Fail every pod asking for slices was refused until Redis was back (red team, 2026-12-05)."""

from __future__ import annotations

import asyncio

import pytest

from deploy.local.redis import RedisServer, new_password
from shared.config import load_config
from shared.serving.supervise import Supervisor
from shared.store.session import open_ledger

pytestmark = pytest.mark.redis


async def _until(what: str, cond: object, timeout: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():  # type: ignore[operator]
        assert loop.time() < end, f"not within {timeout}s: {what}"
        await asyncio.sleep(0.1)


async def test_the_webhook_stays_ready_while_redis_is_away_once_it_has_the_card_shapes() -> None:
    server = RedisServer(password=new_password()).start()
    cfg = load_config(env={}, flags={"redisUrl": server.url})
    shapes, books = Supervisor(), Supervisor()
    opened = []
    try:
        for sup, shapes_only in ((shapes, True), (books, False)):
            opened.append(await asyncio.wait_for(open_ledger(cfg, sup, shapes_only=shapes_only), 10))
        await _until("both ready", lambda: not shapes.problems() and not books.problems())
        server.stop()
        await _until("the booking role unready", lambda: bool(books.problems()))
        assert any("Redis" in p for p in books.problems()), books.problems()
        assert shapes.problems() == [], shapes.problems()
    finally:
        for sup in (shapes, books):
            await sup.cancel()
        for ledger, mirror in opened:
            await ledger.redis.aclose()
            await mirror.subscriber.aclose()
        server.cleanup()


async def test_the_webhook_is_not_ready_before_it_has_the_card_shapes() -> None:
    server = RedisServer(password=new_password()).start()
    server.stop()  # never reachable: nothing loaded
    sup = Supervisor()
    task = asyncio.create_task(open_ledger(load_config(env={}, flags={"redisUrl": server.url}), sup,
                                           shapes_only=True))
    try:
        await _until("a reason", lambda: bool(sup.problems()), 10)
        assert any("Redis" in p for p in sup.problems()), sup.problems()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        server.cleanup()
