"""Fixtures for the failover suite: a real Redis Sentinel setup and a real Redis Cluster on 127.0.0.1,
started here (never mocked), both requiring a password so that every connection authenticates.

`redis_client` (tests/conftest.py) is overridden with a client of each topology made by
`shared.store.ledger.connect`, so the ledger fixtures built on it (`ledger`, and tests/redis's `cluster`
and `populated`, imported below) and the tests of tests/redis that take them run unchanged on
Sentinel and on Cluster. `mirror_factory` likewise makes mirrors subscribed through
`connect_subscriber`. Tests that kill processes start setups of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from deploy.local.redis import ClusterSetup, SentinelSetup
from shared.store.ledger import connect, connect_subscriber
from tests.redis.conftest import MirrorFactory, cluster, mirrors, populated

__all__ = ["cluster", "populated"]  # fixtures of tests/redis, on the topology of `redis_client`

PASSWORD = "ha/s3cret@:%"  # characters that need quoting in a URL


@pytest.fixture(scope="session")
def sentinel_setup() -> Iterator[SentinelSetup]:
    setup = SentinelSetup(password=PASSWORD).start()
    yield setup
    setup.cleanup()


@pytest.fixture(scope="session")
def cluster_setup() -> Iterator[ClusterSetup]:
    setup = ClusterSetup(password=PASSWORD).start()
    yield setup
    setup.cleanup()


@contextlib.contextmanager
def own_cluster() -> Iterator[ClusterSetup]:
    """A Cluster of a test module's own, for tests that move slots or kill processes."""
    setup = ClusterSetup(password=PASSWORD).start()
    try:
        yield setup
    finally:
        setup.cleanup()


@pytest.fixture(params=["sentinel", "cluster"])
def ha_url(request: pytest.FixtureRequest) -> str:
    """The URL of one topology (the session's setups, never killed)."""
    setup: SentinelSetup | ClusterSetup = request.getfixturevalue(f"{request.param}_setup")
    return setup.url


@pytest.fixture
async def redis_client(ha_url: str) -> AsyncIterator[Redis]:
    client = connect(ha_url)
    await client.flushall()  # on a cluster: every primary
    yield client
    await client.aclose()


async def settle_feed(url: str, client: RedisCluster) -> None:
    """Until every feed message published so far reached the node mirrors subscribe to.

    The cluster bus forwards a PUBLISH to the other nodes asynchronously (here often ~40 ms later), so
    a mirror started just after a change on another shard can receive its message after having read
    the node: harmless, but an extra read where the tests count reads. A marker published on every
    primary comes after everything that primary published before (one ordered link per pair of nodes).
    """
    sub = connect_subscriber(url)  # the node the mirrors' subscribers go to first
    pubsub = sub.pubsub()
    try:
        await pubsub.subscribe("mt:fence")
        await client.initialize()  # a new client knows no nodes yet
        primaries = client.get_primaries()
        assert primaries
        for node in primaries:
            await client.execute_command("PUBLISH", "mt:fence", node.name, target_nodes=node)
        seen: set[str] = set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while len(seen) < len(primaries) and loop.time() < deadline:
            msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.5)
            if msg is not None:
                seen.add(str(msg["data"]))
        assert len(seen) == len(primaries), f"fence markers received: {sorted(seen)}"
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]
        await sub.aclose()


@pytest.fixture
async def mirror_factory(ha_url: str) -> AsyncIterator[MirrorFactory]:
    """Mirrors subscribed as the roles subscribe (connect_subscriber)."""
    async def clients() -> tuple[Redis, Redis]:
        client, sub = connect(ha_url), connect_subscriber(ha_url)
        if isinstance(client, RedisCluster):
            await settle_feed(ha_url, client)
        return client, sub

    async with mirrors(clients) as make:
        yield make
