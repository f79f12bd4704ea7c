"""Red team, day 2: a mirror reads every node it does not hold, even at its first write (version 1), since that
message may be another database's (tests/redis/test_redteam_day2_shared_feed.py). A fleet added at once (a new
cluster's node watcher upserting 500-5,000 nodes) then cost every mirror one snapshot round trip per node, one after
the other, and the feed (every other node's bookings) waited behind them: 2,000 new nodes took the mirror 2.8 s on
loopback where applying their messages took 1.3 s (1.5 ms more per node over a 1 ms network). The nodes new in the
messages at hand are read together, pipelined (SNAPSHOT_BATCH per round trip), as a resync reads them."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from shared.store.ledger import Ledger
from tests.redis.conftest import MirrorFactory
from tests.redis.helpers import S4000, eventually, inventory

NEW = 300


def gated(fn: Callable[..., Awaitable[Any]], gate: asyncio.Event) -> Callable[..., Awaitable[Any]]:
    async def wait_then(*args: Any, **kwargs: Any) -> Any:
        await gate.wait()
        return await fn(*args, **kwargs)
    return wait_then


@pytest.mark.redis
async def test_nodes_added_together_are_read_together(ledger: Ledger, mirror_factory: MirrorFactory) -> None:
    m = await mirror_factory()
    gate = asyncio.Event()  # the mirror's first read held until every node is written: the rest wait in the feed
    m.ledger.snapshot = gated(m.ledger.snapshot, gate)  # type: ignore[method-assign]
    m.ledger.reread = gated(m.ledger.reread, gate)  # type: ignore[method-assign]
    before = m.ledger.round_trips
    sem = asyncio.Semaphore(32)

    async def add(i: int) -> None:
        async with sem:
            await ledger.upsert_node(inventory(f"new-{i:04d}", S4000, 1))

    await asyncio.gather(*(add(i) for i in range(NEW)))
    gate.set()
    await eventually(lambda: len(m.nodes) == NEW, what="the mirror holds every new node")
    assert m.nodes == await ledger.snapshots(await ledger.nodes())
    trips = m.ledger.round_trips - before
    assert trips <= NEW // 10, f"{trips} round trips to read {NEW} new nodes: one each, one after the other"


@pytest.mark.redis
async def test_nodes_created_removed_and_created_again_in_one_batch(ledger: Ledger,
                                                                     mirror_factory: MirrorFactory) -> None:
    """Messages of nodes not held, waiting for the read together: a removal among them (of a node not held: nothing
    to drop) and a node made anew are all answered by the one read, sent after them (what the ledger holds then)."""
    m = await mirror_factory()
    gate = asyncio.Event()
    m.ledger.reread = gated(m.ledger.reread, gate)  # type: ignore[method-assign]
    m.ledger.snapshot = gated(m.ledger.snapshot, gate)  # type: ignore[method-assign]
    await ledger.upsert_node(inventory("first", S4000, 1))  # its read held: the rest wait in the feed
    await ledger.upsert_node(inventory("again", S4000, 1))
    assert (await ledger.reserve("again", "u1", [0], 8, 2, 1, pod="ns/p1"))[0].ok
    assert await ledger.remove_node("again")
    await ledger.upsert_node(inventory("again", S4000, 2))  # made anew: version 1, another stamp
    await ledger.upsert_node(inventory("gone", S4000, 1))
    assert await ledger.remove_node("gone")
    await ledger.upsert_node(inventory("marker", S4000, 1))
    gate.set()
    await eventually(lambda: "marker" in m.nodes, what="the marker reached the mirror")
    assert m.nodes == await ledger.snapshots(await ledger.nodes())
    assert "gone" not in m.nodes and len(m.nodes["again"].cards) == 2 and not m.nodes["again"].reservations
