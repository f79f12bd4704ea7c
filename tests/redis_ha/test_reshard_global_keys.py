"""The ledger's two global keys (`<prefix>:nodes`, `<prefix>:epoch`) while a live reshard moves their slot, on a
real Redis Cluster: each is one key, which Redis moves whole (MIGRATE), so it is read and written on whichever
side holds it (the source, or the target through an ASK redirect that redis-py follows) for the whole move. The
mirror stays ready and current, a node is listed and unlisted, and the state is not taken for lost (`intact`).
A residual of the note of 2026-12-05 said, by reading, that every mirror would go unready meanwhile; this is the
proof that it does not."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from deploy.local.redis import ClusterSetup
from shared.store.ledger import Ledger, connect
from shared.store.mirror import Mirror
from tests.redis.helpers import S4000, inventory
from tests.redis_ha.conftest import own_cluster

pytestmark = pytest.mark.redis_ha


@pytest.fixture(scope="module")
def setup() -> Iterator[ClusterSetup]:
    with own_cluster() as s:
        yield s


async def works_mid_move(led: Ledger, mirror: Mirror, added: str) -> None:
    """What the roles do with the global keys, each done and checked."""
    await mirror.resync()  # periodic: lists the nodes
    await mirror.resync(full=True)  # a full read
    assert not mirror.moving
    assert await led.intact()
    await led.upsert_node(inventory(added, S4000))  # listed (SADD), then its keys
    assert added in await led.nodes()
    await mirror.resync(full=True)
    assert added in mirror.nodes and mirror.nodes[added].cards
    ok, _ = await led.reserve(added, f"u-{added}", [0], 8, 2, 1, pod=f"ns/{added}")
    assert ok.ok
    assert await led.remove_node(added) is True  # keys deleted, then unlisted (SREM)
    assert added not in await led.nodes()
    await mirror.resync(full=True)
    assert added not in mirror.nodes


@pytest.mark.parametrize("which", ["nodes", "epoch"])
async def test_the_global_keys_are_read_and_written_for_the_whole_move_of_their_slot(
        setup: ClusterSetup, which: str) -> None:
    led = Ledger(connect(setup.url), prefix=f"g{which}")
    mirror = Mirror(led)
    try:
        await led.load_scripts()
        for n in ("ga", "gb"):
            await led.upsert_node(inventory(n, S4000))
        await led.redis.set(led.epoch_key, "1")  # (what a rebuild writes)
        await mirror.resync(full=True)
        key = led.nodes_key if which == "nodes" else led.epoch_key
        source = setup.owner_of(key)
        dest = next(n for n in setup.nodes if n is not source)
        slot = await asyncio.to_thread(setup.begin_move, key, dest)
        try:
            await works_mid_move(led, mirror, "gc")  # the slot open, the key still on the source
            while await asyncio.to_thread(setup.move_keys, slot, dest, 100):
                pass
            assert not await asyncio.to_thread(setup._has_keys, source, slot)  # every key of the slot moved
            assert await asyncio.to_thread(setup.owner_of, key) is source  # ... and the slot not given away yet
            await works_mid_move(led, mirror, "gd")  # the key on the target, reached through ASK
        finally:
            await asyncio.to_thread(setup.end_move, slot, dest)
        await works_mid_move(led, mirror, "ge")  # and after
        assert set(await led.nodes()) == {"ga", "gb"}
    finally:
        await led.redis.aclose()
