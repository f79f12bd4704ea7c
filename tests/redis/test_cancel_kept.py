"""A task cancelled while it awaits Redis commands ends, on the roles' own client (its socket timeout included).

With redis-py 7.4.1 on Python 3.11 a client with a socket timeout lost 23-32 of 60 such cancels (the task went on as
if never cancelled: bench/cancel_probe.py; a red team's stress hung on it); the roles' clients send under `within`
(shared/store/redis_conn.py `_keep_cancels`). Real redis-server, the product's `connect`, the probe's loop."""

from __future__ import annotations

import pytest

from bench.cancel_probe import count_lost
from deploy.local.redis_server import RedisServer
from shared.store.redis_conn import connect

pytestmark = pytest.mark.redis
TRIALS = 60


async def test_cancels_reach_a_task_in_a_redis_call(redis_server: RedisServer) -> None:
    client = connect(redis_server.url)
    try:
        lost = await count_lost(client, TRIALS)
    finally:
        await client.aclose()
    assert lost == 0, f"{lost} of {TRIALS} cancels lost"
