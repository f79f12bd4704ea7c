"""A master that hangs instead of dying (a paused VM, a partition that drops packets: no reset ever comes): the
sentinels (the cluster) promote its replica, and the roles' clients must move on to it.

Found by the whole stack on Sentinel (tests/e2e/test_ha_stack.py's scenario with SIGSTOP for SIGKILL): with no
socket timeout on the data nodes' connections, every pooled connection to the frozen master waited for ever; the
watchers' pass stuck in one such call verified no node again, and for the 2 minutes the test waited after the
failover kube-scheduler's every bind was refused `node unverified`. Here: a ledger with idle pooled connections,
the master SIGSTOPped, the failover, and then calls that must be answered by the new master, the first after one
socket timeout at most (redis_conn.SOCKET_TIMEOUT; two on Cluster, 10.3 s measured), the next one meeting none (the
idle connections were dropped). Counted in socket timeouts: a call that meets a hung connection waits one out
whole, so a call shorter than one met none. Before the fix both tests' first call hung for good.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator

import pytest

from deploy.local.redis import ClusterSetup, RedisServer, SentinelSetup, wait_until
from deploy.local.redis_server import cmd
from shared.store.ledger import Ledger, connect
from shared.store.redis_conn import SOCKET_TIMEOUT
from tests.redis_ha.conftest import PASSWORD

pytestmark = pytest.mark.redis_ha


@pytest.fixture
def frozen() -> Iterator[list[RedisServer]]:
    """Servers SIGSTOPped by the test, thawed after it whatever happens."""
    out: list[RedisServer] = []
    yield out
    for r in out:
        if r.proc is not None and r.proc.poll() is None:
            os.kill(r.proc.pid, signal.SIGCONT)


def freeze(server: RedisServer, frozen: list[RedisServer]) -> None:
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)
    frozen.append(server)


def thaw_and_clean(frozen: list[RedisServer], setup: SentinelSetup | ClusterSetup) -> None:
    """Thaw what the test froze, then stop the setup's servers."""
    for r in frozen:
        assert r.proc is not None
        os.kill(r.proc.pid, signal.SIGCONT)
    setup.cleanup()


async def answered_twice(led: Ledger) -> tuple[float, float]:
    """How long the next two calls took (each bounded: a hang fails the test instead of hanging it)."""
    took = []
    for _ in range(2):
        t = time.monotonic()
        await asyncio.wait_for(led.redis_time_ms(), 3 * SOCKET_TIMEOUT)
        took.append(time.monotonic() - t)
    return took[0], took[1]


async def test_sentinel_clients_leave_a_hung_master(frozen: list[RedisServer]) -> None:
    setup = SentinelSetup(password=PASSWORD, replicas=1).start()
    try:
        led = Ledger(connect(setup.url))
        await asyncio.gather(*(led.redis_time_ms() for _ in range(4)))  # idle connections in the pool
        old = setup.master()
        freeze(old, frozen)

        def switched() -> bool:  # every sentinel names another master (the frozen one cannot say it is not)
            for i in range(len(setup.sentinel_ports)):
                with setup.sentinel_client(i) as s:
                    if int(cmd(s, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", setup.service)[1]) == old.port:
                        return False
            return True

        await asyncio.to_thread(wait_until, switched, 30, "failover away from the hung master")
        first, second = await answered_twice(led)
        # counted in socket timeouts, not timed: a call that meets a hung connection waits one out whole, so the
        # first met at most one and the second none (the idle connections to the frozen master were dropped)
        assert first < 2 * SOCKET_TIMEOUT and second < SOCKET_TIMEOUT, (first, second)
        await led.redis.aclose()
    finally:
        thaw_and_clean(frozen, setup)


async def test_cluster_clients_leave_a_hung_primary(frozen: list[RedisServer]) -> None:
    setup = ClusterSetup(masters=3, replicas=1, password=PASSWORD).start()
    try:
        led = Ledger(connect(setup.url))
        await led.load_scripts()
        node = "gpu-1"
        key = f"mt:{{{node}}}:node"
        await asyncio.gather(*(led.redis.exists(key) for _ in range(4)))  # idle connections to the key's shard
        old = setup.owner_of(key)
        freeze(old, frozen)

        def settled() -> bool:
            running = [n for n in setup.nodes if n is not old]
            owners = [setup._owners(n) for n in running]
            return all(o == owners[0] for o in owners) and str(old.port) not in {p for _r, p in owners[0]}

        await asyncio.to_thread(wait_until, settled, 30, "a replica took the hung primary's slots")
        took = []
        for _ in range(2):
            t = time.monotonic()
            await asyncio.wait_for(led.snapshots([node]), 3 * SOCKET_TIMEOUT)  # a script on the key's shard
            took.append(time.monotonic() - t)
        # the read, then redis-py's re-read of the slots from the nodes it knows, may each meet the hung one once
        # (counted in socket timeouts, each waited out whole, as above); the next call meets none
        assert took[0] < 3 * SOCKET_TIMEOUT and took[1] < SOCKET_TIMEOUT, took
        await led.redis.aclose()
    finally:
        thaw_and_clean(frozen, setup)
