"""Red team of the feed's liveness PING (shared/store/mirror.py, Mirror._run, FEED_SILENCE_SECONDS): a healthy
feed must never be taken for silent. Real Redis, loopback only."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from redis.asyncio import Redis

from deploy.local.redis import RedisServer
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from shared.store.redis_conn import connect_subscriber
from tests.redis.helpers import eventually


@pytest.mark.redis
async def test_an_idle_resp3_feed_that_answers_is_kept(cluster: Ledger, redis_server: RedisServer) -> None:
    """A subscriber on RESP3 (redis://...?protocol=3, through connect_subscriber: decode_responses=True).
    On a subscribed RESP3 connection Redis answers PING with a plain +PONG, which hiredis decodes to the str
    "PONG"; redis-py's PubSub.handle_message only recognises bytes b"PONG", so the str is read as a
    subscribe-type message ("P", "O", "N") and dropped by ignore_subscribe_messages: get_message returns None,
    the mirror never hears its pong and replaces a healthy idle feed every 2 x silence_seconds (readiness
    cleared, a full re-read, mtsched_feed_silences_total incremented each time)."""
    sep = "&" if "?" in redis_server.url else "?"
    sub = connect_subscriber(f"{redis_server.url}{sep}protocol=3")
    client = Redis.from_url(redis_server.url, decode_responses=True)
    # (1 s to answer each: a shorter wait took a stall of the busy machine for a silence)
    m = Mirror(Ledger(client), subscriber=sub, resync_seconds=3600.0, silence_seconds=1.0)
    await m.start()
    try:
        await asyncio.wait_for(m.ready.wait(), 10)
        await eventually(lambda: m.pings >= 3, within=30, what="three liveness PINGs on an idle RESP3 feed")
        assert m.silences == 0  # each PING was answered: the connection must have been kept
    finally:
        await m.stop()
        await client.aclose()
        await sub.aclose()


@pytest.mark.redis
async def test_a_loop_blocked_while_the_pong_is_in_flight_keeps_the_feed(cluster: Ledger,
                                                                         redis_server: RedisServer) -> None:
    """The event loop is blocked (another task's synchronous work) for longer than silence_seconds, starting
    right after the PING was written and before its pong is read. When the loop resumes, the pong's read event
    and get_message's expired timeout fire in the same loop iteration: the timeout wins, get_message returns
    None with the pong in the stream's buffer, and the mirror raises FeedSilent on a healthy connection.
    (The block is injected by wrapping PubSub.ping only to hit the pong's round-trip window deterministically.)"""
    client = Redis.from_url(redis_server.url, decode_responses=True)
    sub = Redis.from_url(redis_server.url, decode_responses=True)
    m = Mirror(Ledger(client), subscriber=sub, resync_seconds=3600.0, silence_seconds=0.3)
    make = sub.pubsub

    def pubsub(**kw: Any) -> Any:
        ps = make(**kw)
        ping = ps.ping

        async def blocking_ping(*args: Any) -> Any:
            result = await ping(*args)
            asyncio.get_running_loop().call_soon(time.sleep, 0.5)  # another callback blocks the loop
            return result

        ps.ping = blocking_ping  # type: ignore[method-assign]
        return ps

    sub.pubsub = pubsub  # type: ignore[method-assign]
    await m.start()
    try:
        await asyncio.wait_for(m.ready.wait(), 10)
        await eventually(lambda: m.pings >= 2, within=20, what="two liveness PINGs")
        assert m.silences == 0
    finally:
        await m.stop()
        await client.aclose()
        await sub.aclose()
