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

import pytest

from deploy.local.redis import SentinelSetup
from deploy.local.redis_server import cmd
from shared.store.ledger import Ledger, connect
from shared.store.redis_conn import master_replaced
from tests.redis.helpers import S4000, inventory
from tests.redis_ha.test_redteam_sentinel_deposed import (
    CUT,
    cut_off,
    on_a_replaced_master,
    replaced,
    setup,
    writes_answered,
)

__all__ = ["setup"]  # the fixture: data nodes with min-replicas-to-write 1

pytestmark = pytest.mark.redis_ha


async def test_a_write_refused_by_a_replaced_master_is_not_taken_for_one_that_ran(setup: SentinelSetup) -> None:
    async with on_a_replaced_master(setup) as (led, _):  # no booking on n1: a replace drops nothing
        before = led.round_trips
        out = await led.replace_node(inventory("n1", S4000), {}, keep_ms=0)

        assert led.round_trips - before >= 2  # the first send went to the replaced master, and was refused there
        assert not out.get("dropped")
        assert out["maybe_dropped"] is False, out  # nothing ran on the replaced master: nothing may have dropped


def strand_first_sentinel(setup: SentinelSetup, old_port: int) -> None:
    """The first sentinel of the roles' URL left with the old master: as one beside it (the same zone, the same pod in
    charts that put a sentinel next to each data node) that the partition cut off from the others with it, it never
    hears of the failover and goes on naming the old master, which it still reaches and sees as a master."""
    with setup.sentinel_client(0) as s:
        cmd(s, "SENTINEL", "REMOVE", setup.service)
        cmd(s, "SENTINEL", "MONITOR", setup.service, "127.0.0.1", str(old_port), "2")
        cmd(s, "SENTINEL", "SET", setup.service, "auth-pass", CUT, "down-after-milliseconds", "600000")
        state = s.sentinel_master(setup.service)
        assert int(state["port"]) == old_port and state["is_master"] and not state["is_sdown"], state


async def test_a_role_leaves_a_replaced_master_that_a_stranded_sentinel_still_names(setup: SentinelSetup) -> None:
    """The sentinels that failed the master over name the new one with a newer config epoch; a sentinel stranded with
    the old master names it still, with its old epoch. redis-py takes the first sentinel that answers (the one that
    answered last time, else the URL's first), so a role whose first sentinel is the stranded one took the old master
    for the named one: every write refused NOREPLICAS for the whole partition, its feed silent."""
    async with on_a_replaced_master(setup) as (led, old_port):
        strand_first_sentinel(setup, old_port)
        await writes_answered(led, "the sentinels that failed over name a reachable master")


async def test_a_connection_busy_when_the_pool_learned_of_the_new_master_reads_there(setup: SentinelSetup) -> None:
    """The pool drops its idle connections when it learns that the sentinels name another master (a new connection,
    a replaced master's NOREPLICAS, a silent feed's check), not those in use at that moment: back in the pool, one of
    those went on reading the replaced master (nothing refuses a read) until a write was sent on it, and a mirror's
    re-read after leaving a deposed feed (its `master_replaced(self.ledger.redis)`) could read there the state from
    before the failover."""
    led = Ledger(connect(setup.url))
    writer: Ledger | None = None
    try:
        await led.load_scripts()
        await led.upsert_node(inventory("n1", S4000))
        pool = led.redis.connection_pool
        busy = await pool.get_connection()  # a command in flight on it while the pool learns of the new master
        old_port = cut_off(setup)
        await replaced(setup, old_port)
        assert await master_replaced(led.redis)
        await pool.release(busy)

        writer = Ledger(connect(setup.url))
        await writer.upsert_node(inventory("n1", S4000, cordoned=[1]))  # written on the master the sentinels name
        snap = await led.snapshot("n1")
        assert snap is not None and snap.cards[1].health == "cordoned", "read on the replaced master"
    finally:
        await led.redis.aclose()
        if writer is not None:
            await writer.redis.aclose()
