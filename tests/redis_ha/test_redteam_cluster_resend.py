"""Red team: on Redis Cluster, a script whose reply is lost must be sent again by the Ledger, not by redis-py.

The Ledger's resend rule (LedgerCore._retry) records each error it sends a call again after (`resent`), so that a
call whose first send may have run, its reply lost, is answered as the first run would have been
(ledger._may_have_run): a give-back that finds nothing held the second time is "released" (its caller nudges the node
for the pods kube-scheduler turned away), a replace_node that may have dropped bookings says `maybe_dropped` (a
rebuild's `freed`), and a keep window is counted back from the call, not from a send (Ledger._keep_window).

redis-py 7.4.1's asyncio RedisCluster sends a command again by itself, up to 3 times (its default Retry), after a
TimeoutError or a ConnectionError (`RedisCluster.ERRORS_ALLOW_RETRY`), and the Ledger never learns of it: the same
packed command, with the keep window of the first send, answered by its second run. Standalone and Sentinel clients
retry nothing of their own (their connections' Retry has 0 retries), so only Cluster lost these guarantees.

Here a primary is frozen (SIGSTOP) under a give-back, then thawed as soon as the client's first send timed out: the
first send runs from the socket's buffer (its reply goes to a closed connection), and a send again finds nothing.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from redis import exceptions as rexc
from redis.asyncio.cluster import NodesManager

from deploy.local.redis import ClusterSetup, RedisServer
from shared.store import redis_conn
from shared.store.ledger import Ledger, connect
from tests.redis.helpers import S4000, inventory
from tests.redis_ha.conftest import PASSWORD

pytestmark = pytest.mark.redis_ha

TIMEOUT = 0.5  # the clients' socket timeout here: a frozen primary's reply is given up on this soon


@pytest.fixture(scope="module")
def setup() -> Iterator[ClusterSetup]:
    # a long node timeout: a primary frozen for a second is not failed over (there is no replica anyway)
    s = ClusterSetup(masters=3, password=PASSWORD, node_timeout_ms=15000).start()
    try:
        yield s
    finally:
        for n in s.nodes:
            if n.proc is not None and n.proc.poll() is None:
                os.kill(n.proc.pid, signal.SIGCONT)
        s.cleanup()


@pytest.fixture
async def led(setup: ClusterSetup, request: pytest.FixtureRequest,
              monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Ledger]:
    monkeypatch.setattr(redis_conn, "SOCKET_TIMEOUT", TIMEOUT)
    ledger = Ledger(connect(setup.url), prefix=f"rs{abs(hash(request.node.name)) % 10**6}")
    await ledger.load_scripts()
    yield ledger
    await ledger.redis.aclose()


async def lost_reply(setup: ClusterSetup, led: Ledger, node: str, call: Any) -> Any:
    """Run `call()` with the primary of `node` frozen, thawed as soon as the client gave up on the first send."""
    primary: RedisServer = setup.owner_of(led.node_key(node))
    assert primary.proc is not None
    timed_out = asyncio.Event()
    original = NodesManager.move_node_to_end_of_cached_nodes

    def moved(self: NodesManager, name: str) -> Any:  # redis-py's step after a TimeoutError or ConnectionError
        timed_out.set()
        return original(self, name)

    NodesManager.move_node_to_end_of_cached_nodes = moved  # type: ignore[method-assign]
    os.kill(primary.proc.pid, signal.SIGSTOP)
    try:
        task = asyncio.create_task(call())
        await asyncio.wait_for(timed_out.wait(), 10)
    finally:
        os.kill(primary.proc.pid, signal.SIGCONT)
    try:
        return await asyncio.wait_for(task, 30)
    finally:
        NodesManager.move_node_to_end_of_cached_nodes = original  # type: ignore[method-assign]


async def test_a_give_back_whose_reply_was_lost_says_released(setup: ClusterSetup, led: Ledger) -> None:
    node = "n1"
    await led.upsert_node(inventory(node, S4000))
    assert (await led.reserve(node, "u1", [0], 8, 2, 1, pod="ns/p1"))[0].ok
    fate, _feed = await lost_reply(setup, led, node, lambda: led.give_back(node, "u1"))
    snap = await led.snapshot(node)
    assert snap is not None and "u1" not in snap.reservations  # released (by the first send)
    # the first send released it: its caller must hear so, and nudge the node (docs/redis-layout.md, `release`)
    assert fate == "released"


async def test_a_replace_whose_reply_was_lost_says_it_may_have_dropped(setup: ClusterSetup, led: Ledger) -> None:
    node = "n2"
    await led.upsert_node(inventory(node, S4000))
    assert (await led.reserve(node, "u2", [0], 8, 2, 1, pod="ns/p2"))[0].ok
    assert await led.mark_bound(node, "u2")  # bound, and its pod gone from the API's truth: dropped
    out = await lost_reply(setup, led, node, lambda: led.replace_node(inventory(node, S4000), {}, keep_ms=0))
    snap = await led.snapshot(node)
    assert snap is not None and "u2" not in snap.reservations  # dropped (by the first send)
    assert out["maybe_dropped"]  # or a rebuild tells kube-scheduler of no freed card


async def test_a_call_to_a_frozen_primary_gives_up_after_the_ledgers_own_sends(setup: ClusterSetup,
                                                                               led: Ledger) -> None:
    """docs/redis-layout.md "Losing Redis": against a frozen Redis a call raises after its sends' socket timeouts
    (3 of them with the roles' retry settings, ~15 s). redis-py's own resends made each of those sends four, each
    waiting its socket timeout out: ~60 s on a Cluster primary frozen until its replica is promoted."""
    node = "n3"
    await led.upsert_node(inventory(node, S4000))
    led.retry_seconds = 0  # the sends connection_retries allows: 3
    primary = setup.owner_of(led.node_key(node))
    assert primary.proc is not None
    os.kill(primary.proc.pid, signal.SIGSTOP)
    try:
        loop = asyncio.get_running_loop()
        t = loop.time()
        with pytest.raises(rexc.TimeoutError):  # redis-py's (a hang would be asyncio's, after 60 s)
            await asyncio.wait_for(led.snapshot(node), 60)
        took = loop.time() - t
    finally:
        os.kill(primary.proc.pid, signal.SIGCONT)
    # three sends, each a socket timeout (and a quick read of the slots from the other primaries) before the next
    assert took < 6 * TIMEOUT, took
