"""Review: a Node event queued before the rebuild read its node list was handled after the rebuild, over it.

The node watcher queues each node's newest event (NodeWatcher.offer) and handles it in the node's turn (run_events); a
re-list of its own stream drops the queue (on_sync: its view is newer). The reconciler's rebuild (Redis lost its state)
lists the Nodes itself and writes every node under the watcher's lock, but left the queue alone: an event received
before that list (an older state of its node) was taken after the rebuild and written over it, in Redis and in the
watcher's `last`, which every reconcile pass compares with (so no pass repaired it). It stood until the node's next
event was handled, at least the node's 1 s interval later and as late as the stream delivers it: a card the Node no
longer reported, or one reported unhealthy, was offered meanwhile. So was an older event a lagging stream delivered
after the rebuild. Now the rebuild drops the queued events no newer than its list (NodeWatcher.supersede), and the
watcher skips later ones: by resourceVersion where it is comparable (Kubernetes 1.35, KEP-5504), else by the order
they came.

Counted, never timed: the queue's clock is the test's. Real parts: redis-server, the product's Ledger, Mirror,
NodeWatcher (its Reflector's event path, its queue and worker), PodWatcher and Reconciler.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis import exceptions as rexc
from redis.asyncio import Redis

from controller.node_watch import NodeWatcher
from controller.reconciler import Reconciler
from shared.domain.node import Inventory
from shared.serving.supervise import cancel_and_wait
from shared.store.ledger import Ledger
from tests._wait import eventually
from tests.redis.test_redteam_inflight_nodes import gpu_node
from tests.redis.test_redteam_node_event_flood import Clock, stream
from tests.redis.test_redteam_rebuild_race import role

pytestmark = pytest.mark.redis


def node(cards: int, rv: str) -> dict[str, Any]:
    n = gpu_node("n", cards=cards)
    n["metadata"]["resourceVersion"] = rv
    return n


class Api:
    """Lists `nodes` at resourceVersion `rv`, no pods; takes the nudges."""

    def __init__(self, nodes: list[dict[str, Any]], rv: str):
        self.nodes, self.rv = nodes, rv

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        if method == "PATCH":
            return {}
        assert method == "GET", (method, path)
        items = [dict(n) for n in self.nodes] if path == "/api/v1/nodes" else []
        return {"items": items, "metadata": {"resourceVersion": self.rv}}

    async def get_pod(self, ns: str, name: str) -> Any:
        raise AssertionError(f"unexpected GET pod {ns}/{name}")

    async def create_event(self, *_: Any, **__: Any) -> None:
        return None


@pytest.fixture
async def rig(ledger: Ledger) -> AsyncIterator[tuple[Api, NodeWatcher, Reconciler, list[asyncio.Task[None]]]]:
    """The role on node n with 4 cards (resourceVersion 10), after its first rebuild; its node worker not started."""
    api = Api([node(4, "10")], "10")
    nodes, _pods, rec = await role(ledger, api)  # type: ignore[arg-type]
    nodes.clock = Clock()
    await rec.rebuild("start")
    tasks: list[asyncio.Task[None]] = []
    try:
        yield api, nodes, rec, tasks
    finally:
        assert not await cancel_and_wait(tasks)


async def cards(ledger: Ledger) -> int:
    snap = await ledger.snapshot("n")
    assert snap is not None
    return len([c for c in snap.cards.values() if c.health == "ok"])


async def drained(nodes: NodeWatcher) -> None:
    """The worker has nothing queued and handles nothing (it handles under the lock)."""
    await eventually(lambda: not nodes.events.pending, what="the queue drained")
    async with nodes.lock:
        pass


async def lost(rig: tuple[Api, NodeWatcher, Reconciler, list[asyncio.Task[None]]], redis_client: Redis, node_rv: str,
               list_rv: str) -> tuple[Api, NodeWatcher, Reconciler, list[asyncio.Task[None]]]:
    """Redis lost its state; the API server lists n with 2 cards (its resourceVersion `node_rv`, the list's
    `list_rv`)."""
    rig[0].nodes, rig[0].rv = [node(2, node_rv)], list_rv
    await redis_client.flushall()
    return rig


@pytest.mark.parametrize("why", ["state lost", "node missing"])
@pytest.mark.parametrize("rvs", ["comparable", "opaque"])
async def test_a_node_event_queued_before_the_rebuild_list_is_not_written_over_it(
        rig: tuple[Api, NodeWatcher, Reconciler, list[asyncio.Task[None]]], ledger: Ledger, redis_client: Redis,
        rvs: str, why: str) -> None:
    api, nodes, rec, tasks = rig
    old, new = ("20", "30") if rvs == "comparable" else ("opaque-b", "opaque-c")
    # n goes to 8 cards, an event queued while the worker is busy elsewhere (not started: it waits its turn) ...
    await stream(nodes, "MODIFIED", node(8, old))
    assert len(nodes.events) == 1
    # ... then back to 2 (two cards gone) before Redis is lost: the rebuild lists it so and writes it
    api.nodes, api.rv = [node(2, new)], new
    if why == "state lost":
        await redis_client.flushall()  # (else another replica forgot a node: Redis still holds n)
    await rec.rebuild(why)
    assert await cards(ledger) == 2
    tasks.append(asyncio.create_task(nodes.run_events()))
    await drained(nodes)
    assert await cards(ledger) == 2, (
        f"the rebuild wrote n with 2 cards from its list; the node event received before that list (8 cards) was "
        f"handled after it: the ledger offers {await cards(ledger)} cards, {await cards(ledger) - 2} the Node no "
        "longer reports")
    assert len(nodes.last["n"].cards) == 2  # the view the reconciler compares with: the list's
    if why == "node missing":  # (a node Redis lost books nothing for the keep window anyway: its fence)
        booked = (await ledger.reserve("n", "p", [7], 2, 1, 1, pod="ns/p"))[0]
        assert not booked.ok, "a slice booked on card 7, which the Node no longer reports"
    # a reconcile pass leaves it so (it compares with that view)
    await rec.reconcile_all()
    assert await cards(ledger) == 2


async def test_an_older_event_a_lagging_stream_delivers_after_the_rebuild_is_skipped(
        rig: tuple[Api, NodeWatcher, Reconciler, list[asyncio.Task[None]]], ledger: Ledger,
        redis_client: Redis) -> None:
    _, nodes, rec, tasks = await lost(rig, redis_client, "30", "31")
    await rec.rebuild("state lost")
    tasks.append(asyncio.create_task(nodes.run_events()))
    await stream(nodes, "MODIFIED", node(8, "20"))  # the stream lags: a state older than the rebuild's list
    await drained(nodes)
    assert await cards(ledger) == 2, f"an event older than the rebuild's list wrote {await cards(ledger)} cards"
    await stream(nodes, "MODIFIED", node(6, "32"))  # a newer one is handled as ever
    await drained(nodes)
    assert await cards(ledger) == 6


async def test_an_event_received_after_the_list_with_an_opaque_version_is_handled(
        rig: tuple[Api, NodeWatcher, Reconciler, list[asyncio.Task[None]]], ledger: Ledger,
        redis_client: Redis) -> None:
    """Not comparable, and received after the list was requested: it may be newer than the list, so it is handled."""
    _, nodes, rec, tasks = await lost(rig, redis_client, "opaque-b", "opaque-b")
    real = nodes.reflector.list

    async def list_then_event() -> tuple[list[dict[str, Any]], str]:
        out = await real()
        await stream(nodes, "MODIFIED", node(6, "opaque-c"))  # the rebuild holds the lock: queued
        return out

    nodes.reflector.list = list_then_event  # type: ignore[method-assign]
    await rec.rebuild("state lost")
    nodes.reflector.list = real  # type: ignore[method-assign]
    assert await cards(ledger) == 2 and len(nodes.events) == 1
    tasks.append(asyncio.create_task(nodes.run_events()))
    await drained(nodes)
    assert await cards(ledger) == 6


async def test_a_node_whose_change_could_not_be_written_is_open_again_once_a_rebuild_wrote_it(
        rig: tuple[Api, NodeWatcher, Reconciler, list[asyncio.Task[None]]], ledger: Ledger) -> None:
    """Closed while its change is refused (NodeWatcher._stuck), its queued change dropped by a rebuild that wrote a
    newer state of it: open as written, not closed for good with nothing left to try."""
    api, nodes, rec, tasks = rig
    real = ledger.upsert_node

    async def refused(inv: Inventory, *args: Any, **kwargs: Any) -> int:
        if len(inv.cards) == 7:
            raise rexc.ResponseError("BADINPUT cards: refused for this test")
        return await real(inv, *args, **kwargs)

    ledger.upsert_node = refused  # type: ignore[method-assign]
    tasks.append(asyncio.create_task(nodes.run_events()))
    await stream(nodes, "MODIFIED", node(7, "20"))
    await eventually(lambda: "n" in nodes.stuck and nodes.stuck["n"].closed, what="n closed, its change refused")
    snap = await ledger.snapshot("n")
    assert snap is not None and snap.error
    api.nodes, api.rv = [node(2, "30")], "30"
    await rec.rebuild("node missing")
    await drained(nodes)
    assert "n" not in nodes.stuck and not nodes.events.pending
    await rec.reconcile_all()
    snap = await ledger.snapshot("n")
    assert snap is not None and not snap.error and len(snap.cards) == 2, (snap.error, len(snap.cards))
