"""Red team, day 2: two ledgers on two databases of one Redis (a cluster moved from `/0` to `/1` while the old
release's watchers still run, or two clusters sharing a Redis by database number with the default keyPrefix).

Keys are per database but Pub/Sub channels are not: both ledgers publish on `mt:feed`, and each one's mirrors
hear the other's writes. A message of the other ledger must never change what a mirror holds: it may only make the
mirror read its own ledger again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from deploy.local.redis import RedisServer
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis.helpers import S4000, S5000, eventually, inventory


@pytest.fixture
async def two_dbs(redis_server: RedisServer, redis_client: Redis) -> AsyncIterator[tuple[Ledger, Ledger, Mirror]]:
    """(ledger on /0, ledger on /1, a started mirror of /1); both databases empty at the start."""
    url1 = redis_server.url.rsplit("/", 1)[0] + "/1"
    c0, c1, sub1 = (Redis.from_url(u, decode_responses=True) for u in (redis_server.url, url1, url1))
    await c1.flushdb()
    led0, led1 = Ledger(c0), Ledger(c1)
    await led0.load_scripts()
    await led1.load_scripts()
    await led1.upsert_node(inventory("gpu-1", S4000))
    m = Mirror(Ledger(c1), subscriber=sub1, resync_seconds=300.0)  # no periodic re-read within the test
    await m.start()
    await asyncio.wait_for(m.ready.wait(), 10)
    yield led0, led1, m
    await m.stop()
    await c1.flushdb()
    for c in (c0, c1, sub1):
        await c.aclose()


async def mirrors_own(m: Mirror, led: Ledger) -> bool:
    return m.nodes == await led.snapshots(await led.nodes())


@pytest.mark.redis
async def test_a_node_removed_in_another_database_stays_in_the_mirror(two_dbs: tuple[Ledger, Ledger, Mirror]) -> None:
    led0, led1, m = two_dbs
    await led0.upsert_node(inventory("gpu-1", S5000))  # the same node name in the other ledger
    assert (await led1.reserve("gpu-1", "u1", [0], 8, 2, 1, pod="ns/p1"))[0].ok
    await eventually(lambda: mirrors_own(m, led1), what="the mirror holds its own ledger")
    assert await led0.remove_node("gpu-1")  # the other ledger forgets its node of that name
    # a marker write after it on our own ledger: once the mirror has it, the removal was heard too
    await led1.upsert_node(inventory("marker", S4000, 1))
    await eventually(lambda: "marker" in m.nodes, what="the marker reached the mirror")
    assert m.get("gpu-1") is not None, "the other database's removal dropped our node from the mirror"
    await eventually(lambda: mirrors_own(m, led1), what="the mirror equals its own ledger")


@pytest.mark.redis
async def test_a_node_new_in_another_database_is_not_mirrored(two_dbs: tuple[Ledger, Ledger, Mirror]) -> None:
    led0, led1, m = two_dbs
    await led0.upsert_node(inventory("other-cluster-node", S5000))  # version 1 on the other ledger
    await led1.upsert_node(inventory("marker", S4000, 1))
    await eventually(lambda: "marker" in m.nodes, what="the marker reached the mirror")
    assert m.get("other-cluster-node") is None, "a node of the other database appeared in the mirror"
    await eventually(lambda: mirrors_own(m, led1), what="the mirror equals its own ledger")
