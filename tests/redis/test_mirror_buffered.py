"""The mirror takes the feed messages its connection has already read without redis-py's per-message layers
(shared/store/mirror.py buffered_messages): same messages, same order, other replies left to redis-py."""

from __future__ import annotations

import asyncio
import threading

import pytest
from redis._parsers import _AsyncRESP2Parser
from redis.asyncio import Redis

from deploy.local.redis import RedisServer
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror, buffered_messages
from tests.redis.conftest import MirrorFactory, mirrors
from tests.redis.helpers import eventually

CHANNEL = "mt:test-feed"


@pytest.mark.redis
async def test_buffered_messages_are_those_already_read_in_order_and_other_replies_go_to_redis_py(
        redis_server: RedisServer) -> None:
    sub = Redis.from_url(redis_server.url, decode_responses=True)
    pub = Redis.from_url(redis_server.url, decode_responses=True)
    pubsub = sub.pubsub()
    try:
        await pubsub.subscribe(CHANNEL)
        assert (await pubsub.get_message(timeout=5))["type"] == "subscribe"  # type: ignore[index]
        for i in range(3):
            # Redis writes the subscriber's message in the same turn it answers the publisher
            assert await pub.publish(CHANNEL, f"m{i}") == 1
        await pubsub.ping()  # its pong comes between the messages: redis-py's handle_message takes it
        for i in range(3, 5):
            assert await pub.publish(CHANNEL, f"m{i}") == 1
        # In one turn Redis writes the publisher's reply before the subscriber's message, so a client can read
        # the reply while m4 is still unwritten. Redis reads a later command only after finishing that turn:
        # once this ping is answered, every message is in the subscriber's socket.
        assert await pub.ping()
        # one socket read brings every reply; get_message hands over the first
        first = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5)
        assert first is not None and first["data"] == "m0"
        pongs: list[int] = []
        assert [m async for m in buffered_messages(pubsub, lambda: pongs.append(1))] == ["m1", "m2", "m3", "m4"]
        assert pongs == [1]  # the pong is reported as a reply (the mirror's liveness check hears it)
        assert [m async for m in buffered_messages(pubsub)] == []  # nothing more was read: none waited for
        assert await pub.publish(CHANNEL, "m5") == 1
        later = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5)  # the usual path still reads
        assert later is not None and later["data"] == "m5"
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]
        await sub.aclose()
        await pub.aclose()


@pytest.mark.redis
async def test_without_hiredis_every_message_goes_through_get_message(redis_server: RedisServer) -> None:
    sub = Redis.from_url(redis_server.url, decode_responses=True, parser_class=_AsyncRESP2Parser)
    pub = Redis.from_url(redis_server.url, decode_responses=True)
    pubsub = sub.pubsub()
    try:
        await pubsub.subscribe(CHANNEL)
        for i in range(2):
            assert await pub.publish(CHANNEL, f"m{i}") == 1
        assert await pub.ping()  # Redis has finished writing to the subscriber (see the test above)
        seen = []
        while not seen:  # the first read: both messages are on the connection by now
            m = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5)
            if m is not None:
                seen.append(m["data"])
        assert [m async for m in buffered_messages(pubsub)] == []  # nothing taken past redis-py's own parser
        while len(seen) < 2:
            m = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5)
            if m is not None:
                seen.append(m["data"])
        assert seen == ["m0", "m1"]  # and nothing lost: the second still comes from get_message
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]
        await sub.aclose()
        await pub.aclose()


def _burst(url: str, steps: int) -> None:
    """A booking and its release on n4, `steps` times, from a client of its own on a loop of its own (a thread)."""

    async def run() -> None:
        client = Redis.from_url(url, decode_responses=True)
        led = Ledger(client)
        try:
            for i in range(steps):
                assert (await led.reserve("n4", f"b{i}", [i % 2], 8, 2, 1, pod=f"ns/b{i}"))[0].ok
                assert await led.release("n4", f"b{i}")
        finally:
            await client.aclose()

    asyncio.run(run())


@pytest.mark.redis
@pytest.mark.parametrize("hiredis", [True, False])
async def test_a_burst_the_mirror_could_not_read_meanwhile_is_applied_whole_and_in_order(
        cluster: Ledger, redis_server: RedisServer, hiredis: bool) -> None:
    async def clients() -> tuple[Redis, Redis]:
        extra = {} if hiredis else {"parser_class": _AsyncRESP2Parser}
        return (Redis.from_url(redis_server.url, decode_responses=True),
                Redis.from_url(redis_server.url, decode_responses=True, **extra))

    make: MirrorFactory
    async with mirrors(clients) as make:
        m: Mirror = await make()
        before_applied, steps = m.applied, 30
        thread = threading.Thread(target=_burst, args=(redis_server.url, steps))
        thread.start()
        thread.join()  # this loop is held meanwhile: every message waits in the mirror's socket
        writes = 2 * steps

        async def caught_up() -> bool:
            return m.applied - before_applied == writes

        await eventually(caught_up, what="every message of the burst applied")
        assert m.refetches == 0  # in order: each was the next version, none re-read
        assert m.nodes == await cluster.snapshots(await cluster.nodes())
        if hiredis:
            assert m.buffered >= writes // 2  # most came with the first read, not one get_message each
        else:
            assert m.buffered == 0
