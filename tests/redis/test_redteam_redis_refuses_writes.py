"""Red team: Redis answers PING but refuses every write, and every role says it is ready.

Two ordinary operator situations leave Redis up, answering `PING`, serving reads, and refusing every write:

* `maxmemory` reached with the chart's `--maxmemory-policy noeviction` (deploy/helm/hami/values.yaml,
  docs/install.md "Redis": `noeviction`): every script that writes answers `OOM command not allowed when used
  memory > 'maxmemory'`;
* the URL now points at a read-only replica (an external Redis whose endpoint lands on a demoted master after a
  failover, a DNS name cached, a Service selecting the wrong pod): every write answers `READONLY`.

The roles' Redis readiness condition is only a PING's age (`shared/store/session.py` `open_ledger`,
`Heartbeat("Redis", 6.0)` fed by `probe_loop(ping)`), and the mirror stays in sync (reads work). So `/readyz`
says ok on every role while the extender cannot book or bind a single pod and the watcher can neither record
nor release one. docs/runbooks.md "A role is not ready or restarts" promises that /readyz lists every reason
a role cannot do its job; `mtsched_redis_up` (MtschedRedisUnreachable) stays 1 too, so no Redis alert fires.

Besides, `OutOfMemoryError` is not transient to the supervisor (`shared/serving/supervise.py` `is_transient`):
a watcher task that hits it five times in a row makes the process exit 1 ("a bug"), a crash loop instead of
the documented "transient failures never make a role exit" while Redis is full.

Expected: the Redis condition proves that Redis accepts the role's writes (e.g. a probe write of a scratch
key of the prefix, or the role's last script's outcome), so /readyz says `redis: ... refuses writes (OOM /
READONLY)`; OOM counted as transient. Fix: shared/store/session.py (probe), shared/serving/supervise.py
(is_transient).

Real parts: redis-server, the product's open_ledger, Supervisor, Ledger.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.exceptions as rexc
from redis.asyncio import Redis

from deploy.local.redis import RedisServer
from shared.config import load_config
from shared.serving.supervise import Supervisor, is_transient
from shared.store.session import open_ledger
from tests.redis.helpers import S4000, inventory

pytestmark = pytest.mark.redis


@pytest.fixture
async def writes_refused(request: pytest.FixtureRequest, redis_client: Redis) -> AsyncIterator[str]:
    how = request.param
    yield how
    # undo, so the session's redis-server serves the next tests
    await redis_client.config_set("maxmemory", 0)
    await redis_client.execute_command("REPLICAOF", "NO", "ONE")


async def refuse_writes(client: Redis, how: str) -> None:
    if how == "oom":
        await client.config_set("maxmemory-policy", "noeviction")
        await client.config_set("maxmemory", 1)  # any used memory is over it: the chart's noeviction at its limit
    else:
        # a replica of a master that is not there (port 1): it keeps its data, serves reads, refuses writes
        await client.execute_command("REPLICAOF", "127.0.0.1", "1")


@pytest.mark.parametrize("writes_refused", ["oom", "readonly"], indirect=True)
async def test_redteam_op_readyz_says_so_when_redis_refuses_every_write(redis_server: RedisServer,
                                                                        redis_client: Redis,
                                                                        writes_refused: str) -> None:
    cfg = load_config(env={}, flags={"redisUrl": redis_server.url})
    sup = Supervisor()
    ledger, mirror = await asyncio.wait_for(open_ledger(cfg, sup), 10)
    try:
        await ledger.upsert_node(inventory("n", S4000))
        await asyncio.wait_for(mirror.ready.wait(), 10)
        for _ in range(50):
            if not sup.problems():
                break
            await asyncio.sleep(0.2)
        assert sup.problems() == [], sup.problems()

        await refuse_writes(redis_client, writes_refused)
        with pytest.raises(Exception) as refused:  # LedgerError wrapping OOM / READONLY
            await ledger.reserve("n", "u1", [0], 8, 2, 1, pod="ns/p1")
        # the role cannot book anything now; give the probe (every 2 s) and the 6 s heartbeat their time
        await asyncio.sleep(8.0)
        assert sup.problems(), (
            f"Redis refuses every write ({type(refused.value).__name__}: {refused.value}); the role cannot book, "
            f"bind, record or release a pod, yet its readiness lists no problem (/readyz 200 'ok'); "
            f"mtsched_redis_up stays 1")
    finally:
        await redis_client.config_set("maxmemory", 0)
        await redis_client.execute_command("REPLICAOF", "NO", "ONE")
        await sup.cancel()
        await ledger.redis.aclose()
        await mirror.subscriber.aclose()


def test_redteam_op_redis_out_of_memory_is_transient() -> None:
    """A full Redis (noeviction) heals when memory is freed or the limit raised: no role should exit over it."""
    e = rexc.OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")
    assert is_transient(e), ("OutOfMemoryError counts as 'other' (a bug): five in a row make a watcher exit 1 "
                             "(crash loop) while Redis is full")
