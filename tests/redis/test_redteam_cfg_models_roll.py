"""Red team, configuration changes: `memoryPerCard` [96, 160] -> [96] (and back) rolled while pods hold S5000 cards.
For as long as the roll lasts an old and a new watcher share one Redis and disagree about the S5000 node: one
writes it with cards, the other closed (`no configured card model`). What must hold whichever wrote last: the
holders keep their usage (on placeholder cards while it is closed), a booking in flight is kept, nothing is
booked on a closed node, no card is booked beyond its capacity, and the ledger ends equal to the API's truth
under the configuration that stays.

Real parts: redis-server, Ledger, NodeWatcher, PodWatcher, Reconciler (one per release, each with its Config); the
API client answers lists and GETs of one node and one bound pod."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from controller.node_watch import NodeWatcher
from controller.pod_watch import PodWatcher
from controller.reconciler import Reconciler
from controller.watchers import wire
from shared.config import Config, load_config
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis.helpers import violations
from tests.redis.test_redteam_heal_bound_pending import ApiWithPods
from tests.redis.test_redteam_inflight_nodes import bound_pod, gpu_node
from tests.redis.test_redteam_rebuild_race import age_fence

pytestmark = pytest.mark.redis


def release(ledger: Ledger, api: ApiWithPods, cfg: Config) -> tuple[NodeWatcher, PodWatcher, Reconciler]:
    nodes = NodeWatcher(api, ledger, cfg)  # type: ignore[arg-type]
    pods = PodWatcher(api, ledger, Mirror(ledger), cfg, nodes.lost)  # type: ignore[arg-type]
    wire(nodes, pods)
    rec = Reconciler(api, ledger, cfg, nodes, pods)  # type: ignore[arg-type]
    pods.nudger.nudge = lambda node: None  # type: ignore[method-assign]
    return nodes, pods, rec


async def live(role: tuple[NodeWatcher, PodWatcher, Reconciler], api: ApiWithPods) -> None:
    """The role's streams listed (as after its start) and live."""
    nodes, pods, _ = role
    await nodes.on_sync([dict(n) for n in api.nodes])
    await pods.on_sync([dict(p) for p in api.pods])
    nodes.reflector.synced.set()
    pods.reflector.synced.set()


async def test_redteam_cfg_two_model_lists_side_by_side_keep_every_holder(ledger: Ledger, redis_client: Redis) -> None:
    api = ApiWithPods([gpu_node("s5", 160)], [bound_pod("p", "s5", 0, 64 * 512, 12)])
    both = release(ledger, api, load_config(env={}, flags={"memoryPerCard": "96,160"}))
    only96 = release(ledger, api, load_config(env={}, flags={"memoryPerCard": "96"}))
    await both[2].rebuild("start")
    await age_fence(redis_client, ledger, "s5", both[2].keep_ms)
    await live(both, api)
    await both[2].reconcile_all()
    # a bind of the [96, 160] release in flight on card 1
    out, _ = await ledger.reserve("s5", "q", [1], 32, 4, 1, pod="ns/q", hold_ms=5000)
    assert out.ok, out

    async def state() -> tuple[str, dict[str, tuple[tuple[int, ...], int, str]], list[str]]:
        snap = await ledger.snapshot("s5")
        assert snap is not None
        return (snap.error, {u: (r.cards, r.mem, r.state) for u, r in snap.reservations.items()},
                violations(snap))

    for flips in range(3):
        await live(only96, api)
        await only96[2].reconcile_all()
        error, held, bad = await state()
        assert "no configured card model" in error, error
        assert held == {"p": ((0,), 64, "bound"), "q": ((1,), 32, "pending")}, (flips, held)
        assert bad == [], bad
        refused, _ = await ledger.reserve("s5", f"r{flips}", [1], 32, 4, 1, pod="ns/r")
        assert not refused.ok, "booked on a node the [96] release closed"
        await live(both, api)
        await both[2].reconcile_all()
        error, held, bad = await state()
        assert error == "" and held == {"p": ((0,), 64, "bound"), "q": ((1,), 32, "pending")}, (flips, error, held)
        assert bad == [], bad
        # the cards offer only what is left of them
        over, _ = await ledger.reserve("s5", f"big{flips}", [0], 128, 4, 1, pod="ns/big")
        assert not over.ok, "card 0 holds 64 of 160 units: 128 more does not fit"
