"""Red team: a node whose change cannot be written is closed in the ledger (NodeWatcher._stuck), unless, `_close`
assumed, this watcher never wrote it, when it "offers nothing already". A watcher that just started (a restart, a
new replica, a roll) has written nothing: its first list meets the Node's refused change, and the ledger holds the node
open, as the watcher before it wrote it, an older state than the Node's. Taken for closed, it stayed open (its card
gone or unhealthy since still offered) while the log and the Warning Event said "closed in the ledger (offers
nothing)", until a reconcile pass or a write of a newer state. Now such a node is closed on what the ledger holds.

Counted, never timed: the queue's clock is the test's. Real parts: redis-server, the product's Ledger, NodeWatcher.
"""

from __future__ import annotations

import pytest

from shared.serving.supervise import Supervisor, cancel_and_wait
from shared.store.ledger import Ledger
from tests._wait import eventually
from tests.redis.test_redteam_node_event_flood import Rig, stream
from tests.redis.test_review_node_stuck_closed import POISON, Api, offers, rig, uid_node  # noqa: F401 (rig: fixture)

pytestmark = pytest.mark.redis


async def test_a_restarted_watcher_closes_a_node_it_never_wrote_whose_change_cannot_be_written(
        rig: tuple[Rig, Supervisor, Api, list[int]], ledger: Ledger) -> None:  # noqa: F811
    _r, _sup, _api, tries = rig  # hot written open with 8 cards by the watcher before
    after = Rig(ledger)  # its successor: has written nothing yet
    after.nodes.kube = Api()  # type: ignore[assignment]
    await after.nodes.on_sync([uid_node("hot", POISON), uid_node("calm", 6)])
    assert tries[0] == 1 and after.nodes.stuck["hot"].closed
    assert await offers(ledger, "calm") == (6, "")
    cards, error = await offers(ledger, "hot")
    assert error, f"hot offers its {cards} cards as the watcher before wrote them, not the Node's latest ({POISON})"
    assert cards == 8 and "cannot write" in error
    booked = (await ledger.reserve("hot", "p", [0], 2, 1, 1, pod="ns/p"))[0]
    assert not booked.ok, "a slice booked on a node whose latest state the ledger does not hold"
    # a newer state that can be written opens it, as the Node says
    after.nodes.reflector.synced.set()
    after.nodes.reflector._working()
    after.start()
    try:
        await stream(after.nodes, "MODIFIED", uid_node("hot", 5))
        after.tick(60.0)
        await eventually(lambda: "hot" not in after.nodes.stuck, what="hot's newer state written")
        assert await offers(ledger, "hot") == (5, "")
    finally:
        assert not await cancel_and_wait(after.tasks)
