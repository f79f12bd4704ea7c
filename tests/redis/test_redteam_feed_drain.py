"""Red team of buffered_messages (shared/store/mirror.py): what the drain takes compared with get_message."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from deploy.local.redis import RedisServer
from shared.store.mirror import buffered_messages

CHANNEL = "mt:rt-feed"


async def _drain_case(url: str, **kw: object) -> tuple[list[object], list[object]]:
    """(what get_message + buffered_messages yield, what get_message alone yields) for the same replies."""
    out = []
    for use_buffer in (True, False):
        sub = Redis.from_url(url, **kw)  # type: ignore[arg-type]
        pub = Redis.from_url(url, decode_responses=True)
        ps = sub.pubsub()
        try:
            await ps.subscribe(CHANNEL)
            await ps.get_message(timeout=5)
            for i in range(3):
                await pub.publish(CHANNEL, f"m{i}")
            await ps.ping()
            await ps.ping("hello")
            for i in range(3, 6):
                await pub.publish(CHANNEL, f"m{i}")
            got: list[object] = []
            for _ in range(20):
                if len(got) >= 6:
                    break
                m = await ps.get_message(ignore_subscribe_messages=True, timeout=0.3)
                if m is not None and m.get("type") == "message":
                    got.append(m["data"])
                    if use_buffer:
                        got.extend([d async for d in buffered_messages(ps)])
            out.append(got)
        finally:
            await ps.aclose()  # type: ignore[no-untyped-call]
            await sub.aclose()
            await pub.aclose()
    return out[0], out[1]


@pytest.mark.redis
@pytest.mark.parametrize("kw", [{"decode_responses": True}, {"decode_responses": False},
                                {"decode_responses": True, "protocol": 3},
                                {"decode_responses": False, "protocol": 3}])
async def test_drain_agrees_with_get_message(redis_server: RedisServer, kw: dict[str, object]) -> None:
    drained, plain = await _drain_case(redis_server.url, **kw)
    assert drained == plain and len(plain) == 6


@pytest.mark.redis
@pytest.mark.parametrize("protocol", [2, 3])
async def test_a_killed_subscriber_mid_burst_still_converges(cluster, redis_server: RedisServer,  # type: ignore[no-untyped-def]
                                                             protocol: int) -> None:
    """A burst is buffered in the mirror's socket, then its subscriber connection is killed: the mirror must
    end equal to Redis (resubscribe + re-read), under RESP2 and RESP3."""
    import threading

    from tests.redis.conftest import mirrors
    from tests.redis.helpers import eventually
    from tests.redis.test_mirror_buffered import _burst

    async def clients() -> tuple[Redis, Redis]:
        return (Redis.from_url(redis_server.url, decode_responses=True),
                Redis.from_url(redis_server.url, decode_responses=True, protocol=protocol))

    async with mirrors(clients) as make:
        m = await make()
        admin = Redis.from_url(redis_server.url, decode_responses=True)
        try:
            thread = threading.Thread(target=_burst, args=(redis_server.url, 20))
            thread.start()
            thread.join()
            await admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
            thread = threading.Thread(target=_burst, args=(redis_server.url, 5))
            thread.start()
            thread.join()

            async def same() -> bool:
                return m.nodes == await cluster.snapshots(await cluster.nodes())

            await eventually(same, what="mirror equal to Redis after the kill")
        finally:
            await admin.aclose()
