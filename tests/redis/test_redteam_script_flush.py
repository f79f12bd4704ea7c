"""Red team (rolling upgrades): a SCRIPT FLUSH that lands between redis-py's load (after a NOSCRIPT) and its second
EVALSHA. Replicas of two releases, or an operator, may flush twice in a row; seen 3-5 times per 1,000 calls when
four releases ran side by side with flushes. The call loads the script once more instead of failing with
LedgerError 'No matching script' (shared/store/ledger_core.py `LedgerCore._call`)."""

from __future__ import annotations

import pytest

from shared.store.ledger import Ledger
from tests.redis.helpers import inventory

pytestmark = pytest.mark.redis


async def test_script_flushed_again_between_load_and_call(ledger: Ledger) -> None:
    redis = ledger.redis
    await redis.config_resetstat()  # no eviction count left by another test (it would make n4 unverified)
    await ledger.upsert_node(inventory("n4", 96))
    real_load = redis.script_load
    flushes = 0

    async def load_then_flushed(text: str) -> str:
        nonlocal flushes
        sha = await real_load(text)
        if flushes == 0:
            flushes += 1
            await redis.script_flush()  # another client's flush lands between the load and the EVALSHA
        return sha

    await redis.script_flush()
    redis.script_load = load_then_flushed  # type: ignore[method-assign]
    try:
        out, _ = await ledger.reserve("n4", "u", [0], 8, 1, 1, pod="ns/p")
    finally:
        redis.script_load = real_load  # type: ignore[method-assign]
    assert flushes == 1 and out.ok
    assert await ledger.mark_bound("n4", "u")  # and the scripts work on afterwards
