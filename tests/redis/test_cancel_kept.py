"""A task cancelled while it awaits Redis commands ends, on the roles' own client (its socket timeout included).

With redis-py 7.4.1 on Python 3.11 a client with a socket timeout lost 23-32 of 60 such cancels (the task went on as
if never cancelled: bench/cancel_probe.py; a red team's stress hung on it); the roles' clients send under `within`
(shared/store/redis_conn.py `_keep_cancels`). Real redis-server, the product's `connect`."""

from __future__ import annotations

import asyncio

import pytest

from deploy.local.redis_server import RedisServer
from shared.store.redis_conn import connect

pytestmark = pytest.mark.redis
TRIALS = 60


async def test_cancels_reach_a_task_in_a_redis_call(redis_server: RedisServer) -> None:
    client = connect(redis_server.url)
    await client.set("k", "v")
    lost = 0
    try:
        for trial in range(TRIALS):
            stop = asyncio.Event()

            async def loop(stop: asyncio.Event = stop) -> None:
                while not stop.is_set():
                    await client.get("k")

            task = asyncio.create_task(loop())
            await asyncio.sleep(0.01 + (trial % 7) * 0.0013)  # cancelled at varying points of its calls
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=1.0)
            if not done:
                lost += 1
                stop.set()  # ended by its flag
                await asyncio.wait({task}, timeout=2.0)
    finally:
        await client.aclose()
    assert lost == 0, f"{lost} of {TRIALS} cancels lost"
