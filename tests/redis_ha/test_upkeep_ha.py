"""The upkeep stamp on Sentinel and on Cluster (shared/store/server_checks.py Ledger.kept): written and aged on the
clock of the server that holds `<prefix>:kept`, the clock script routed by the key (on a cluster redis-py sends TIME
to its client's default node, any shard: tests/redis/test_redteam_upkeep.py), also after the scripts were flushed
everywhere."""

from __future__ import annotations

import pytest

from shared.store.ledger import Ledger

pytestmark = pytest.mark.redis_ha


async def test_the_stamp_is_written_and_aged_where_it_lives(ledger: Ledger) -> None:
    assert await ledger.kept() == (None, None)
    await ledger.mark_kept()
    stamp, age = await ledger.kept()
    assert stamp is not None and age is not None and 0 <= age < 2000, (stamp, age)
    await ledger.redis.set(ledger.keys.kept, str(stamp - 120_000))
    await ledger.redis.script_flush()  # loaded again where the key lives
    age = await ledger.kept_age_ms()
    assert age is not None and 119_000 <= age < 125_000, age
