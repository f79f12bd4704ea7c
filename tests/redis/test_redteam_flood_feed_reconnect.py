"""Red team (floods): a feed connection that Redis drops again right after each resubscribe was read whole at once.

The mirror's backoff was reset as soon as its full re-read after (re)subscribing succeeded, before the connection
had delivered anything: a subscriber that Redis disconnects at its next message (its pubsub output buffer limit
exceeded: `client-output-buffer-limit pubsub`, a mirror whose loop was held while a burst of bookings went on)
resubscribed and re-read every node of the ledger 0.2 s after each drop, for as long as the condition lasted
(every replica's mirror: the re-reads are what loads Redis most). Now the backoff resets only once the feed has
worked (a message taken, or a PING answered) since the resubscribe.

Real parts: redis-server (its own output buffer limit drops the subscriber), the product's Ledger and Mirror.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from redis.asyncio import Redis

from deploy.local.redis import RedisServer
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror

pytestmark = pytest.mark.redis


async def test_a_feed_dropped_at_each_message_is_not_reread_in_a_tight_loop(
        cluster: Ledger, redis_server: RedisServer) -> None:
    admin = Redis.from_url(redis_server.url, decode_responses=True)
    client = Redis.from_url(redis_server.url, decode_responses=True)
    sub = Redis.from_url(redis_server.url, decode_responses=True)
    m = Mirror(Ledger(client), subscriber=sub, resync_seconds=3600.0)
    reads = 0
    nodes = m.ledger.nodes

    async def counted() -> list[str]:
        nonlocal reads
        reads += 1
        return await nodes()

    m.ledger.nodes = counted  # type: ignore[method-assign]

    async def drop() -> None:  # Redis drops the subscriber as soon as it is back (as at its output buffer limit)
        while True:
            await admin.client_kill_filter(_type="pubsub")
            await asyncio.sleep(0.02)

    await m.start()
    busy: asyncio.Task[None] | None = None
    try:
        await asyncio.wait_for(m.ready.wait(), 10)
        busy = asyncio.create_task(drop())
        reads = 0
        await asyncio.sleep(3.0)  # (a count over a span: how often the loop re-read everything meanwhile)
        # 0.2 + 0.4 + 0.8 + 1.6 s of backoff: at most ~5 re-reads (was: one every ~0.2 s, 15 and more)
        assert reads <= 6, f"{reads} full re-reads of the ledger in 3 s"
    finally:
        if busy is not None:
            busy.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await busy
        await m.stop()
        for c in (client, sub, admin):
            await c.aclose()
