"""Fixtures for the ledger suite (real redis-server from tests/conftest.py, never mocked)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from redis.asyncio import Redis

from controller.pod_watch import PodWatcher
from deploy.local.redis import RedisServer
from shared.config import Config
from shared.domain.models import CardModel
from shared.kube import Kube
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis.helpers import S4000, S5000, inventory


@pytest.fixture
async def cluster(ledger: Ledger) -> Ledger:
    """Two nodes: n4 (2 x S4000) and n5 (2 x S5000), nothing booked."""
    await ledger.upsert_node(inventory("n4", S4000))
    await ledger.upsert_node(inventory("n5", S5000))
    return ledger


@pytest.fixture
async def populated(cluster: Ledger) -> Ledger:
    """The two nodes with bookings, plus nx (odd cards) and nerr (a node in error).

    n4: u1 bound on card 0 (8 units, 2 cores), u2 pending on card 1 (16, 4).
    n5: u3 pending exclusive on card 0 (160, 16).
    nx: card 0 cordoned, card 1 unhealthy, card 2 ok with slice_limit 1 and one slice (ux) on it.
    """
    led = cluster
    assert (await led.reserve("n4", "u1", [0], 8, 2, 1, pod="ns/p1"))[0].ok
    assert await led.mark_bound("n4", "u1")
    assert (await led.reserve("n4", "u2", [1], 16, 4, 1, pod="ns/p2"))[0].ok
    assert (await led.reserve("n5", "u3", [0], S5000, 16, 1, model=S5000, whole=True, pod="ns/p3"))[0].ok
    await led.upsert_node(inventory("nx", S4000, 3, slice_limit=1, cordoned=[0], unhealthy=[1]))
    assert (await led.reserve("nx", "ux", [2], 2, 1, 1))[0].ok
    await led.upsert_node(inventory("nerr", S4000, error="sgpu-core capacity 17 is not a multiple of 16"))
    return led


@pytest.fixture
async def mirror(redis_server: RedisServer) -> AsyncIterator[Mirror]:
    """A mirror that is never started: its feed is never applied, as if every message were lost, so only its
    resync (called by the test) brings it up to date."""
    client = Redis.from_url(redis_server.url, decode_responses=True)
    m = Mirror(Ledger(client))
    await m.ledger.load_scripts()
    yield m
    await client.aclose()


MirrorFactory = Callable[..., Awaitable[Mirror]]


@contextlib.asynccontextmanager
async def mirrors(clients: Callable[[], Awaitable[tuple[Redis, Redis]]]) -> AsyncIterator[MirrorFactory]:
    """A factory of started mirrors, each on its own (ledger client, subscriber) from `clients` (as
    replicas have); all are stopped at the end."""
    made: list[tuple[Mirror, Redis, Redis]] = []

    async def make(resync_seconds: float = 300.0) -> Mirror:
        client, sub = await clients()
        m = Mirror(Ledger(client), subscriber=sub, resync_seconds=resync_seconds)
        await m.start()
        await asyncio.wait_for(m.ready.wait(), 10)
        made.append((m, client, sub))
        return m

    try:
        yield make
    finally:
        for m, client, sub in made:
            await m.stop()
            await client.aclose()
            await sub.aclose()


@pytest.fixture
async def mirror_factory(redis_server: RedisServer) -> AsyncIterator[MirrorFactory]:
    async def clients() -> tuple[Redis, Redis]:
        return (Redis.from_url(redis_server.url, decode_responses=True),
                Redis.from_url(redis_server.url, decode_responses=True))

    async with mirrors(clients) as make:
        yield make


WATCHER_CFG = Config(memory_per_card=(CardModel(S4000),))


@pytest.fixture
async def watched(cluster: Ledger) -> AsyncIterator[tuple[Ledger, Mirror, PodWatcher]]:
    """The two nodes of `cluster`, a mirror of them, and a pod watcher on a ledger client of its own (its round trips
    counted apart from the mirror's reads); no API call is made (tests/redis/test_watcher_records.py)."""
    mirror = Mirror(cluster)
    await mirror.start()
    await asyncio.wait_for(mirror.ready.wait(), 5)
    own = Ledger(cluster.redis)
    w = PodWatcher(Kube(None), own, mirror, WATCHER_CFG, asyncio.Event())  # type: ignore[arg-type]
    yield cluster, mirror, w
    await mirror.stop()
