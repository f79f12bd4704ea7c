"""Red team, configuration changes: `pendingTTLSeconds` lowered (120 -> 5) by a `helm upgrade` while an old
extender's Binding is in flight. The old extender holds its booking for its own deadline (5 s for a TTL of 120, plus
the settle second: `Extender._hold_ms`), a new janitor expires pending bookings past 5 s: it must not free the card
while that Binding may still be committed, and frees it once it cannot.

Real parts: redis-server, the Ledger's reserve and expire scripts."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from shared.domain.timing import BIND_SETTLE_S, bind_deadline_s
from shared.store.ledger import Ledger
from tests.redis.helpers import inventory
from tests.redis.test_redteam_inflight_nodes import age

pytestmark = pytest.mark.redis


async def test_redteam_cfg_a_shorter_ttl_does_not_expire_an_old_extenders_binding_in_flight(
        ledger: Ledger, redis_client: Redis) -> None:
    await ledger.upsert_node(inventory("n", 96), create=True)
    old_hold = int((bind_deadline_s(120) + BIND_SETTLE_S) * 1000)
    out, _ = await ledger.reserve("n", "u", [0], 32, 4, 1, pod="ns/p", hold_ms=old_hold)
    assert out.ok
    await age(redis_client, ledger, "n", "u", 5_500)  # past the new TTL, its Binding's deadline not yet
    assert await ledger.expire("n", 5) == [], "freed while the old extender's Binding may still be committed"
    key = ledger.keys.res("n", "u")
    settle_by = int(await redis_client.hget(key, "settle_by"))  # type: ignore[misc]
    await redis_client.hset(key, "settle_by", settle_by - old_hold - 1)  # type: ignore[misc]
    assert await ledger.expire("n", 5) == ["u"]
