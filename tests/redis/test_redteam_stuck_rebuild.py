"""Red team: a rebuild reopened a node the watcher holds closed (NodeWatcher._stuck), on a state older than the Node's.

A node whose latest change cannot be written is closed in the ledger on its last written state (fail closed: nothing is
placed on a state known to be old) and its change tried again with backoff. The reconciler's rebuild wrote every node
from its own list, this one open, and dropped the queued change only when it was no newer than that list
(NodeWatcher.supersede): a change newer than the list stayed queued, the node still `stuck` and taken as closed, so its
next failed try closed nothing (`Stuck.closed`) and the node offered the list's older state, e.g. cards the Node has
since reported unhealthy or gone, until a reconcile pass closed it again. Now the rebuild writes such a node closed.

Counted, never timed: the queue's clock is the test's. Real parts: redis-server, the product's Ledger, NodeWatcher, its
queue and worker, PodWatcher and Reconciler.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis import exceptions as rexc

from controller.node_watch import NodeWatcher
from controller.reconciler import Reconciler
from shared.domain.node import Inventory
from shared.store.ledger import Ledger
from tests._wait import eventually
from tests.redis.test_redteam_node_event_flood import stream
from tests.redis.test_review_rebuild_node_queue import Api, node, rig  # noqa: F401 (the fixture)

pytestmark = pytest.mark.redis


async def test_a_rebuild_keeps_closed_a_node_whose_newer_change_cannot_be_written(
        rig: tuple[Api, NodeWatcher, Reconciler, list[asyncio.Task[None]]], ledger: Ledger) -> None:  # noqa: F811
    api, nodes, rec, tasks = rig
    tries = [0]
    for name in ("upsert_node", "replace_node"):  # (a node closed before is written whole again: replace_node)
        real = getattr(ledger, name)

        async def refused(inv: Inventory, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
            if len(inv.cards) == 7:
                tries[0] += 1
                raise rexc.ResponseError("BADINPUT cards: refused for this test")
            return await _real(inv, *args, **kwargs)

        setattr(ledger, name, refused)
    tasks.append(asyncio.create_task(nodes.run_events()))
    # the rebuild's list is at 30 (n with 2 cards), read before n's change at 40 (7 cards) that cannot be written
    api.nodes, api.rv = [node(2, "30")], "30"
    await stream(nodes, "MODIFIED", node(7, "40"))
    await eventually(lambda: "n" in nodes.stuck and nodes.stuck["n"].closed, what="n closed, its change refused")
    await rec.rebuild("node missing")
    assert "n" in nodes.stuck and len(nodes.events) == 1  # its change is newer than the list: still to write

    async def error() -> str:
        snap = await ledger.snapshot("n")
        assert snap is not None
        return snap.error

    assert await error(), "the rebuild wrote n open on its list's state, older than the Node's latest (7 cards)"
    # and its next failed try leaves it closed
    before = tries[0]
    nodes.clock.now += 60.0  # type: ignore[attr-defined]
    nodes._offered.set()
    await eventually(lambda: tries[0] > before and len(nodes.events) == 1, what="n tried again")
    assert await error()
    booked = (await ledger.reserve("n", "p", [0], 2, 1, 1, pod="ns/p"))[0]
    assert not booked.ok, "a slice booked on a node whose latest state the ledger does not hold"
