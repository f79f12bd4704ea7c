"""Review: one Node whose change cannot be written made the whole watcher role unready, and left that node open.

A change that fails for a reason no retry cures soon (Redis refusing that node's write, a bug on the Node's shape) was
put back and tried at each interval, and after 10 s readiness said `nodes: 1 node change(s) not handled`: the
reconciler waited for every node meanwhile (it runs only while the views are live), and, every watcher replica meeting
the same Node, no ready watcher stamped the ledger: after watchersLostAfterSeconds every extender placed no slice pod
anywhere. The node itself stayed open on its last written state, which is not the Node's (a card gone or unhealthy
since was still offered). Now the node is closed in the ledger (its last written state with an error: fail closed),
reported (mtsched_nodes_unwritten, a Warning Event on the Node, a log line), its change tried again with backoff, and
the role stays ready for the other nodes; only a node that cannot even be closed counts against readiness
(tests/redis/test_review_node_event_poison.py). A re-list meeting such a node does the same instead of failing whole.

Counted, never timed: the queue's clock is the test's. Real parts: redis-server, the product's Ledger, NodeWatcher (its
Reflector's event path, its queue and worker) under the role's Supervisor.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis import exceptions as rexc

from controller.node_watch import NODES_UNWRITTEN
from shared.domain.node import Inventory, node_inventory
from shared.serving.supervise import Supervisor
from shared.store.ledger import Ledger
from tests._wait import eventually
from tests.redis.test_redteam_node_event_flood import Rig, stream
from tests.redis.test_redteam_node_health import CFG, gpu_node

pytestmark = pytest.mark.redis
POISON = 7  # a state of node hot with this many cards is refused by Redis (its shape: a refusal, not an outage)


class Api:
    """Takes the watcher's Events."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        assert (method, path) == ("POST", "/api/v1/namespaces/default/events"), (method, path)
        self.events.append(body)
        return body


def refuse_the_poison(ledger: Ledger, tries: list[int]) -> None:
    for name in ("upsert_node", "replace_node"):
        real = getattr(ledger, name)

        async def refused(inv: Inventory, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
            if inv.node == "hot" and len(inv.cards) == POISON:
                tries[0] += 1
                raise rexc.ResponseError("BADINPUT cards: refused for this test")
            return await _real(inv, *args, **kwargs)

        setattr(ledger, name, refused)


def uid_node(name: str, cards: int) -> dict[str, Any]:
    n = gpu_node(name, cards=cards)
    n["metadata"]["uid"] = f"{name}-uid"
    return n


@pytest.fixture
async def rig(ledger: Ledger) -> AsyncIterator[tuple[Rig, Supervisor, Api, list[int]]]:
    rig = Rig(ledger)
    api = Api()
    rig.nodes.kube = api  # type: ignore[assignment]
    await rig.nodes.on_sync([uid_node("hot", 8), uid_node("calm", 8)])
    rig.nodes.reflector.synced.set()
    rig.nodes.reflector._working()
    tries = [0]
    refuse_the_poison(ledger, tries)
    sup = Supervisor(max_backoff=0.05, healthy_after=60.0)
    sup.spawn("node-events", rig.nodes.run_events)
    try:
        yield rig, sup, api, tries
    finally:
        assert not await sup.cancel()


async def offers(ledger: Ledger, node: str) -> tuple[int, str]:
    snap = await ledger.snapshot(node)
    assert snap is not None
    return len(snap.cards), snap.error


async def test_a_node_whose_change_cannot_be_written_is_closed_and_the_role_stays_ready(
        rig: tuple[Rig, Supervisor, Api, list[int]], ledger: Ledger) -> None:
    r, sup, api, tries = rig
    nodes = r.nodes
    await stream(nodes, "MODIFIED", uid_node("hot", POISON))
    await eventually(lambda: tries[0] >= 1, what="hot's change refused")

    async def closed() -> bool:
        return bool((await offers(ledger, "hot"))[1])

    await eventually(closed, what="hot closed in the ledger (it offered its last written state, not the Node's)")
    assert not sup.failed.is_set()
    cards, error = await offers(ledger, "hot")
    assert cards == 8 and "cannot write this node's latest state" in error, (cards, error)
    booked = (await ledger.reserve("hot", "p", [0], 2, 1, 1, pod="ns/p"))[0]
    assert not booked.ok, "a slice booked on a node whose latest state the ledger does not hold"
    # ready for the other nodes, and the reconciler's view live: only the one node is out, and closed
    assert nodes.problem(0) == "", nodes.problem(0)
    r.tick(60.0)  # (however long it lasts)
    await eventually(lambda: tries[0] >= 2, what="hot tried again")
    assert nodes.problem(0) == "", nodes.problem(0)
    # the same view the reconciler compares with: closed too, so no pass opens it again
    last = nodes.last["hot"]
    assert nodes.effective(last).error == error and len(last.cards) == 8
    # reported: the gauge, one Warning Event on the Node
    assert NODES_UNWRITTEN._value.get() == 1
    await eventually(lambda: len(api.events) == 1, what="the Event on the Node")
    ev = api.events[0]
    assert (ev["involvedObject"]["kind"], ev["involvedObject"]["name"], ev["involvedObject"]["uid"]) == \
        ("Node", "hot", "hot-uid")
    assert ev["type"] == "Warning" and ev["reason"] == "MtschedNodeNotWritten" and "BADINPUT" in ev["message"]
    # tried again with backoff: each failure waits twice as long as the one before, up to 30 s
    waits = []
    for _ in range(7):
        before = tries[0]
        waits.append(nodes.events.wait(r.clock.now))
        r.tick(waits[-1] or 0.0)
        await eventually(lambda b=before: tries[0] > b, what="hot tried again in its turn")
        await eventually(lambda: len(nodes.events) == 1, what="put back")
    assert waits[1:] == [4.0, 8.0, 16.0, 30.0, 30.0, 30.0], waits
    assert len(api.events) == 1  # reported once, not at each try
    # another node is handled meanwhile
    await stream(nodes, "MODIFIED", uid_node("calm", 6))
    await eventually(lambda: nodes.last.get("calm") == node_inventory(uid_node("calm", 6), CFG), what="calm handled")
    # a newer state of hot that can be written: handled at its next try, the node open as the Node says
    await stream(nodes, "MODIFIED", uid_node("hot", 5))
    r.tick(30.0)
    await eventually(lambda: "hot" not in nodes.stuck, what="hot's newer state written")
    assert await offers(ledger, "hot") == (5, "")
    assert NODES_UNWRITTEN._value.get() == 0 and nodes.problem(0) == ""
    assert not sup.failed.is_set()


async def test_a_relist_meeting_such_a_node_closes_it_and_writes_the_others(
        rig: tuple[Rig, Supervisor, Api, list[int]], ledger: Ledger) -> None:
    r, _sup, _api, tries = rig
    nodes = r.nodes
    await nodes.on_sync([uid_node("hot", POISON), uid_node("calm", 6), uid_node("new", 4)])
    assert tries[0] == 1
    assert await offers(ledger, "calm") == (6, "") and await offers(ledger, "new") == (4, "")
    cards, error = await offers(ledger, "hot")
    assert cards == 8 and "cannot write" in error
    assert nodes.problem(0) == "" and len(nodes.events) == 1  # queued, tried again with backoff
    r.tick(1.0)
    await eventually(lambda: tries[0] == 2, what="tried again")
    await stream(nodes, "MODIFIED", uid_node("hot", 8))
    r.tick(2.0)
    await eventually(lambda: "hot" not in nodes.stuck, what="hot written")
    assert await offers(ledger, "hot") == (8, "")
