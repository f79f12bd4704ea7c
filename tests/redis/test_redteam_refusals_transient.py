"""Red team: Redis refusals that heal by themselves are transient to the supervisor: NOREPLICAS and BUSY.

`shared/serving/supervise.py` gives up on a task that fails five times in a row with an error that is not transient
("a bug": the process exits, Kubernetes restarts it, with a growing back-off). Two refusals of an ordinary Redis are
plain ResponseErrors to redis-py, wrapped by the Ledger in a LedgerError:

* NOREPLICAS: a master with `min-replicas-to-write 1` (docs/install.md asks it of every Sentinel data node) and no
  replica in reach refuses every write, a command or a script's, until a replica is back (its restart, a failover:
  docs/install.md "the extenders and watchers report not ready until a replica is back");
* BUSY: a script that runs past `busy-reply-threshold` (another tenant's, or an operator's) makes Redis refuse every
  other command until it ends or is killed.

The watchers' janitor, whose expire of a booking past its TTL failed so at every sweep, and their reconciler, whose
repairs did, crash-looped the role for as long, instead of staying up, unready, and going on at once when Redis did
(OOM had the same flaw: tests/redis/test_redteam_redis_refuses_writes.py). Real redis-server, the Ledger's errors.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from redis import exceptions as rexc
from redis.asyncio import Redis

from deploy.local.redis import RedisServer
from shared.serving.supervise import is_transient
from shared.store.ledger import Ledger, LedgerError
from tests.redis.helpers import S4000, inventory

pytestmark = pytest.mark.redis


async def test_a_master_without_its_replica_refuses_transiently(ledger: Ledger, redis_client: Redis) -> None:
    await ledger.upsert_node(inventory("n1", S4000))
    assert (await ledger.reserve("n1", "u1", [0], 8, 2, 1, pod="ns/p1"))[0].ok
    await redis_client.config_set("min-replicas-max-lag", 10)
    await redis_client.config_set("min-replicas-to-write", 1)  # and no replica: every write refused
    try:
        with pytest.raises(LedgerError, match="NOREPLICAS") as script:
            await ledger.release("n1", "u1")  # (the janitor's expire and the reconciler's repairs write alike)
        with pytest.raises(rexc.ResponseError, match="NOREPLICAS") as plain:
            await ledger.mark_kept()  # the watchers' upkeep stamp
    finally:
        await redis_client.config_set("min-replicas-to-write", 0)
    assert is_transient(script.value), f"a task failing so five times exits the role: {script.value!r}"
    assert is_transient(plain.value), f"a task failing so five times exits the role: {plain.value!r}"


async def test_a_redis_busy_with_a_long_script_refuses_transiently(ledger: Ledger, redis_server: RedisServer,
                                                                   redis_client: Redis) -> None:
    await ledger.upsert_node(inventory("n1", S4000))
    await redis_client.config_set("busy-reply-threshold", 100)  # (lua-time-limit) ms before others are refused
    busy = Redis.from_url(redis_server.url, decode_responses=True)
    loop_script = "local t = redis.call('TIME') while true do end"  # read-only: SCRIPT KILL stops it
    runs = asyncio.create_task(busy.eval(loop_script, 0))
    try:
        error: BaseException | None = None
        for _ in range(100):  # until Redis is past the threshold (bounded)
            try:
                await ledger.reserve("n1", "u1", [0], 8, 2, 1, pod="ns/p1")
            except LedgerError as e:
                error = e
                break
            await asyncio.sleep(0.05)
        assert error is not None and "BUSY" in str(error), error
        assert is_transient(error), f"a task failing so five times exits the role: {error!r}"
    finally:
        for _ in range(100):
            try:
                await redis_client.script_kill()
                break
            except rexc.ResponseError:  # (no script running yet)
                await asyncio.sleep(0.05)
        with contextlib.suppress(rexc.ResponseError):
            await runs  # "Script killed by user with SCRIPT KILL"
        await busy.aclose()
        await redis_client.config_set("busy-reply-threshold", 5000)
