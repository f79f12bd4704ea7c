"""An evicting `maxmemory-policy` on any one primary of a Cluster (or on a Sentinel master) is found by every
role's readiness probe, and the reserve script refuses to book on that primary's nodes (shared/store/eviction.py).
Real Sentinel and Cluster (the session's setups, restored afterwards)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from deploy.local.redis import ClusterSetup
from shared.store.eviction import EVICTING, eviction_refusal
from shared.store.ledger import Ledger, LedgerError, connect
from tests.redis.helpers import S4000, inventory
from tests.redis_ha.conftest import PASSWORD


@pytest.fixture
async def primaries(redis_client: Redis) -> AsyncIterator[list[Redis]]:
    """A plain client per primary (one for Sentinel's master), each set back to noeviction afterwards."""
    if isinstance(redis_client, RedisCluster):
        clients = [Redis(host=n.host, port=n.port, password=redis_client.get_connection_kwargs().get("password"),
                         decode_responses=True) for n in redis_client.get_primaries()]
    else:
        clients = [redis_client]
    yield clients
    for c in clients:
        await c.config_set("maxmemory-policy", "noeviction")
        if c is not redis_client:
            await c.aclose()


async def test_one_evicting_primary_is_enough_to_refuse(ledger: Ledger, redis_client: Redis,
                                                        primaries: list[Redis]) -> None:
    nodes = [f"n{i}" for i in range(12)]  # on a cluster, spread over every shard
    for n in nodes:
        await ledger.upsert_node(inventory(n, S4000))
    assert await ledger.probe_write() and await ledger.evicting_policy() == ""
    await primaries[-1].config_set("maxmemory-policy", "allkeys-lfu")
    assert await ledger.evicting_policy() == "allkeys-lfu"
    with pytest.raises(LedgerError, match="allkeys-lfu"):
        await ledger.probe_write()
    refused = 0
    for i, n in enumerate(nodes):
        out, _ = await ledger.reserve(n, f"u{i}", [0], 8, 2, 1, pod=f"ns/p{i}")
        if not out.ok:
            assert out.refused == eviction_refusal("allkeys-lfu") and out.refused.startswith(EVICTING)
            refused += 1
    # the nodes on that primary (all of them with Sentinel), and only those: each script checks its own server
    if isinstance(redis_client, RedisCluster):
        on_it = sum(1 for n in nodes if redis_client.get_node_from_key(ledger.keys.node(n)).port
                    == primaries[-1].connection_pool.connection_kwargs["port"])
        assert 0 < on_it < len(nodes) and refused == on_it
    else:
        assert refused == len(nodes)


async def test_the_eviction_counts_of_a_cluster_with_a_shard_down_are_read_from_the_others() -> None:
    """Red team (2026-12-05): the reconciler reads every primary's count before each pass; one shard down raised
    there every time, and no pass ran even for the nodes of the shards that serve."""
    setup = await asyncio.to_thread(ClusterSetup(password=PASSWORD).start)
    led = Ledger(connect(setup.url))
    try:
        assert len(await led.evicted_counts()) == 3
        down = setup.nodes[-1]
        await asyncio.to_thread(down.kill)
        counts = await asyncio.wait_for(led.evicted_counts(), 30)
        assert len(counts) == 2 and f"127.0.0.1:{down.port}" not in counts, counts
        assert await led.evicting_policy() == ""  # the readiness probe's check: the shards that serve
    finally:
        await led.redis.aclose()
        await asyncio.to_thread(setup.cleanup)
