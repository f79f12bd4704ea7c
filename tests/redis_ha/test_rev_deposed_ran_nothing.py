"""Review: a write refused NOREPLICAS by a master the sentinels replaced ran nothing, and the Ledger must know it.

redis_conn._SentinelMasterConnection turns that refusal into a ConnectionError so that the Ledger sends the call again,
to the master the sentinels name. But the Ledger's resend rule reads a ConnectionError as "the first send may have
run, its reply lost" (ledger._may_have_run), and answers the call as such a first run would have: a replace_node
says `maybe_dropped` though nothing was dropped (a rebuild then tells kube-scheduler of cards freed that were not), a
give-back that found nothing says "released" (a node PATCH nudging kube-scheduler for nothing), an expire of named
uids reads the node again. The refusal is Redis's own, at the script's first write: nothing ran.
Real sentinels, the old master cut off as in tests/redis_ha/test_redteam_sentinel_deposed.py.
"""

from __future__ import annotations

import asyncio

import pytest

from deploy.local.redis import SentinelSetup
from shared.store.ledger import Ledger, connect
from tests.redis.helpers import S4000, inventory
from tests.redis_ha.test_redteam_sentinel_deposed import cut_off, replaced, setup

__all__ = ["setup"]  # the fixture: data nodes with min-replicas-to-write 1

pytestmark = pytest.mark.redis_ha


async def test_a_write_refused_by_a_replaced_master_is_not_taken_for_one_that_ran(setup: SentinelSetup) -> None:
    led = Ledger(connect(setup.url))
    try:
        await led.load_scripts()
        await led.upsert_node(inventory("n1", S4000))  # no booking on it: a replace drops nothing
        await asyncio.gather(*(led.snapshot("n1") for _ in range(4)))  # idle connections to the master
        old_port = cut_off(setup)
        await replaced(setup, old_port)

        before = led.round_trips
        out = await led.replace_node(inventory("n1", S4000), {}, keep_ms=0)

        assert led.round_trips - before >= 2  # the first send went to the replaced master, and was refused there
        assert not out.get("dropped")
        assert out["maybe_dropped"] is False, out  # nothing ran on the replaced master: nothing may have dropped
    finally:
        await led.redis.aclose()
