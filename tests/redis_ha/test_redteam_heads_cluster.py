"""Red team of 5115570 on a real Redis Cluster: Ledger.heads pipelines one HMGET per node across shards, and a
periodic resync on it reads only the node written (tests/redis/test_mirror_resync.py runs on one server only)."""

from __future__ import annotations

import pytest

from deploy.local.redis import ClusterSetup
from shared.store.ledger import Ledger, connect
from shared.store.mirror import FULL_EVERY, Mirror
from tests.redis.helpers import S4000, inventory

pytestmark = pytest.mark.redis


async def test_heads_and_a_periodic_resync_on_a_cluster(cluster_setup: ClusterSetup) -> None:
    client = connect(cluster_setup.url)
    await client.flushall()
    try:
        led = Ledger(client)
        await led.load_scripts()
        names = [f"n{i}" for i in range(12)]  # spread over the shards by their hash tags
        for n in names:
            await led.upsert_node(inventory(n, S4000))
        heads = await led.heads([*names, "ghost"])
        assert set(heads) == set(names) and all(v == 1 and s for v, s in heads.values())
        m = Mirror(led)
        await m.resync(full=True)
        assert {n: (s.version, s.stamp) for n, s in m.nodes.items()} == heads
        assert (await led.reserve("n7", "u1", [0], 8, 2, 1))[0].ok
        read = m.read
        assert (m.resyncs + 1) % FULL_EVERY
        await m.resync()
        assert m.read == read + 1 and "u1" in m.nodes["n7"].reservations
        assert m.nodes == await led.snapshots(await led.nodes())
    finally:
        await client.aclose()
