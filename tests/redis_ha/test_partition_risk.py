"""The watchers say when Redis is set up so that the fence cannot see every lost booking: a Sentinel master
that accepts writes with no replica in reach goes on booking when it is cut off, and drops those bookings when
it rejoins as a replica of the master promoted meanwhile, with no change of history where the watchers look
(docs/install.md, docs/redis-layout.md "What the bound rests on"). Real Sentinel, real redis-servers."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from redis.asyncio import Redis

from controller.reconciler import Reconciler
from deploy.local.redis_server import RedisServer
from shared.serving.metrics import REDIS_PARTITION_RISK
from shared.store.ledger import Ledger, connect
from tests.redis_ha.test_failover import start_sentinel


async def test_a_sentinel_master_that_writes_alone_is_reported_until_it_needs_a_replica() -> None:
    setup = await start_sentinel()
    led = Ledger(connect(setup.url))
    try:
        risk = await led.partition_risk()
        assert "min-replicas-to-write" in risk, risk
        rec = SimpleNamespace(ledger=led, partition_risk="")
        await Reconciler._check_partition_risk(rec)  # type: ignore[arg-type]
        assert REDIS_PARTITION_RISK._value.get() == 1 and rec.partition_risk == risk
        with setup.master().client() as c:  # what docs/install.md asks of every data node
            c.config_set("min-replicas-max-lag", 10)
            c.config_set("min-replicas-to-write", 1)
        assert await led.partition_risk() == ""
        await Reconciler._check_partition_risk(rec)  # type: ignore[arg-type]
        assert REDIS_PARTITION_RISK._value.get() == 0 and rec.partition_risk == ""
    finally:
        await led.redis.aclose()
        await asyncio.to_thread(setup.cleanup)


async def test_a_replicated_master_behind_one_address_that_writes_alone_is_reported() -> None:
    """Red team (2026-12-05): only Sentinel URLs were looked at; a master with replicas reached at one address
    (a managed Redis, a VIP: whatever fails it over) is the same risk. A master without replicas is not."""
    master = RedisServer().start()
    replica = None
    led = Ledger(Redis.from_url(master.url, decode_responses=True))
    try:
        assert await led.partition_risk() == ""  # alone: nothing to fail over to
        replica = RedisServer(args=["--replicaof", "127.0.0.1", str(master.port)]).start()
        for _ in range(200):  # until the master counts it (bounded)
            if int((await led.redis.info("replication")).get("connected_slaves") or 0) >= 1:
                break
            await asyncio.sleep(0.05)
        assert "min-replicas-to-write" in await led.partition_risk()
        await led.redis.config_set("min-replicas-max-lag", 10)
        await led.redis.config_set("min-replicas-to-write", 1)
        assert await led.partition_risk() == ""
    finally:
        await led.redis.aclose()
        if replica is not None:
            replica.cleanup()
        master.cleanup()
