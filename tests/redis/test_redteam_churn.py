"""Red team (a cluster whose nodes and pods churn for weeks), on a real redis-server: what a role's ledger knows of
a node's keys (`Ledger._known`, what its scripts declare) followed only its own writes. The extender's and the
webhook's kept an entry per node that ever existed (2.4 KB each), and the extender's reserve on a busy node declared
every uid released since its last full re-read (2,744 of them: reserve + release 13x slower). It follows the feed
now: a node removed, a reservation released by another process (shared/store/mirror.py, Ledger.forget)."""

from __future__ import annotations

from shared.store.ledger import Ledger
from tests.redis.conftest import MirrorFactory
from tests.redis.helpers import S4000, eventually, inventory


async def test_an_extenders_ledger_forgets_what_the_watchers_release_and_remove(
        ledger: Ledger, mirror_factory: MirrorFactory) -> None:
    mirror = await mirror_factory()  # the extender's: its mirror and its ledger (the bookings)
    ext = mirror.ledger
    await ledger.upsert_node(inventory("busy", S4000))  # (the watchers' ledger writes the nodes, releases)
    await ledger.upsert_node(inventory("spot", S4000))
    await eventually(lambda: {"busy", "spot"} <= set(mirror.nodes), what="the nodes in the mirror")
    for j in range(40):
        uid = f"churn-{j}"
        assert (await ext.reserve("busy", uid, [0], 2, 1, 1, pod=f"ns/{uid}"))[0].ok
        assert uid in ext.known("busy").uids  # (its own booking: declared by its next scripts)
        await ext.mark_bound("busy", uid)
        assert await ledger.release("busy", uid)  # the watcher's release of the ended pod
    await eventually(lambda: not ext.known("busy").uids, what="the released uids forgotten")
    assert (await ext.reserve("spot", "last", [0], 2, 1, 1, pod="ns/last"))[0].ok
    assert await ledger.release("spot", "last")
    assert await ledger.remove_node("spot")  # the autoscaler took it away
    await eventually(lambda: "spot" not in ext.known_nodes(), what="the removed node forgotten")
    # a node removed while the feed was away: the next resync forgets it
    ext._saw("gone-while-away", cards=("0",))
    await mirror.resync()
    assert ext.known_nodes() == {"busy"}
