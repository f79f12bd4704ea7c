"""Red team: the forms of a damaged counter `counted` (_lib.lua) takes for sound. It compares the field's text with the
whole number it reads, so "-0" (Lua's `%.0f` writes -0 so) passed as 0, and `bump` sent HINCRBY, which Redis refuses
on "-0" ("hash value is not an integer"): every write of the node failed again, for ever, the watchers' repair too,
as before counters started again (tests/redis/test_redteam_damaged_counters.py).

Real parts: redis-server, the product's Ledger and Reconciler."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from shared.store.ledger import Ledger
from tests.redis.test_reconcile_touched import setup

pytestmark = pytest.mark.redis


@pytest.mark.parametrize("field", ["version", "#n"])
async def test_a_negative_zero_counter_starts_again(ledger: Ledger, redis_client: Redis, field: str) -> None:
    rec, _pods = await setup(ledger)
    assert (await ledger.reserve("ta", "u1", [0], 8, 2, 1, pod="ns/p1"))[0].ok
    key = ledger.keys.node("ta") if field == "version" else ledger.keys.ended("ta")
    await redis_client.hset(key, field, "-0")  # type: ignore[misc]
    if field == "version":
        booked = (await ledger.reserve("ta", "u2", [1], 8, 2, 1, pod="ns/p2"))[0]
        assert booked.ok, booked
        await rec.reconcile_all()  # (before: failed, every pass, had it a repair to write)
    assert await ledger.release("ta", "u1", ended=True)
    n = await redis_client.hget(key, field)  # type: ignore[misc]
    assert n is not None and 0 < int(n) < 2 ** 52
