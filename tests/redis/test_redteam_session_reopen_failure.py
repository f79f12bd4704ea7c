"""Red team (session): a node opening again is written whole with its holders (replace_node) because the watcher
remembers that it wrote it closed (NodeWatcher.closed). That memory was dropped before the write: when the write
failed (Redis unreachable past the ledger's retries, a reply that timed out, SOCKET_TIMEOUT), the node event's
handler failed, the reflector listed the nodes again, and that re-list only upserted the node, as if it had never
been closed. The card a running pod holds, booked from its gpu-index while the node was open before (its usage is
recovered from the node's cards, so the holders of a closed node lack it), was then offered free under it until
the reconciler's next pass: the bug tests/redis/test_redteam_node_unrecorded.py fixed, back after one failure."""

from __future__ import annotations

from typing import Any

import pytest
from redis import exceptions as rexc
from redis.asyncio import Redis

from shared.store.ledger import Ledger
from tests.redis.test_redteam_inflight_nodes import age
from tests.redis.test_redteam_node_unrecorded import (
    gpu_node,
    held_with_recovered,
    no_cards,
    recorded_pod,
    roles,
    unrecorded_pod,
)

pytestmark = pytest.mark.redis


@pytest.mark.parametrize("closed", ["sick", "capacity-0"])
async def test_a_failed_reopen_is_written_whole_by_the_re_list(ledger: Ledger, redis_client: Redis,
                                                               closed: str) -> None:
    nodes, pods = await held_with_recovered(ledger, redis_client)
    if closed == "sick":
        # a watcher that starts while the node is closed writes it whole without the recovered pod
        await nodes.on_event("MODIFIED", gpu_node("q", "sick"))
        nodes, pods = await roles(ledger)
        await pods.on_sync([recorded_pod("q"), unrecorded_pod("q")])
        await nodes.on_sync([gpu_node("q", "sick")])
    else:
        await nodes.on_event("MODIFIED", no_cards("q"))  # kept on placeholder cards without the recovered pod

    real = ledger.replace_node
    failed: list[str] = []

    async def once(*args: Any, **kwargs: Any) -> Any:
        if not failed:
            failed.append("x")
            raise rexc.ConnectionError("Redis unreachable (as after the ledger's retries)")
        return await real(*args, **kwargs)

    ledger.replace_node = once  # type: ignore[method-assign]
    with pytest.raises(rexc.ConnectionError):
        await nodes.on_event("MODIFIED", gpu_node("q"))  # open again: the write fails, the handler with it
    assert failed
    await nodes.on_sync([gpu_node("q")])  # the reflector lists again after a failed handler
    snap = (await ledger.snapshots(["q"]))["q"]
    assert snap.error == "" and (snap.cards[0].mem_used, snap.cards[1].mem_used) == (8, 64), snap


async def test_a_closing_write_whose_reply_is_lost_still_counts_as_closed(ledger: Ledger, redis_client: Redis) -> None:
    """The node stops reporting cards and its write onto placeholder cards takes effect, but its reply is lost (a
    timeout: the handler fails); by the reflector's re-list the node reports its cards again."""
    nodes, pods = await roles(ledger)
    await pods.on_sync([recorded_pod("q"), unrecorded_pod("q")])
    await nodes.on_sync([gpu_node("q")])
    for uid in ("u-a", "u-p"):
        await age(redis_client, ledger, "q", uid, 60_000)
    real = ledger.replace_node

    async def lost_reply(*args: Any, **kwargs: Any) -> Any:
        await real(*args, **kwargs)
        raise rexc.TimeoutError("Timeout reading from socket")

    ledger.replace_node = lost_reply  # type: ignore[method-assign]
    with pytest.raises(rexc.TimeoutError):
        await nodes.on_event("MODIFIED", no_cards("q"))
    ledger.replace_node = real  # type: ignore[method-assign]
    await nodes.on_sync([gpu_node("q")])
    snap = (await ledger.snapshots(["q"]))["q"]
    assert snap.error == "" and (snap.cards[0].mem_used, snap.cards[1].mem_used) == (8, 64), snap
