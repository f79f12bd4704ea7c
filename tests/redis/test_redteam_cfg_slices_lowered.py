"""Red team, configuration changes: `maxSlicesPerCard` lowered (16 -> 2) by a `helm upgrade` while a card holds 4
slices. What must hold: the holders keep their slices (nothing running is touched), the card takes no new slice
(CardTimeSlicingExhausted in the filter, the reserve script and explain), the watchers' comparison does not
repair the over-full card again and again (the second pass finds nothing), and the card table and explain answer.

Real parts: redis-server, Ledger, NodeWatcher, PodWatcher, Reconciler under the new Config; the API client answers
lists and GETs of one node and its four bound pods."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from shared.config import load_config
from shared.domain.explain import explain
from shared.domain.fit import fit
from shared.domain.request import pod_request
from shared.store.ledger import Ledger
from tests.redis.helpers import slice_pod, violations
from tests.redis.test_redteam_cfg_models_roll import live, release
from tests.redis.test_redteam_heal_bound_pending import ApiWithPods
from tests.redis.test_redteam_inflight_nodes import bound_pod, gpu_node
from tests.redis.test_redteam_rebuild_race import age_fence

pytestmark = pytest.mark.redis


async def test_redteam_cfg_a_limit_lowered_below_held_slices(ledger: Ledger, redis_client: Redis) -> None:
    pods = [bound_pod(f"p{i}", "n", 0, 2 * 512, 12 if i == 0 else 1) for i in range(4)]
    for p in pods:  # 2 units each (their records say so), cores 12+1+1+1
        p["spec"]["containers"][0]["resources"]["limits"].update({"mthreads.com/sgpu-memory": "2"})
    api = ApiWithPods([gpu_node("n")], pods)
    cfg = load_config(env={}, flags={"maxSlicesPerCard": "2"})
    new = release(ledger, api, cfg)
    await new[2].rebuild("start")
    await age_fence(redis_client, ledger, "n", new[2].keep_ms)
    await live(new, api)
    await new[2].reconcile_all()
    snap = await ledger.snapshot("n")
    assert snap is not None
    c0 = snap.cards[0]
    assert (c0.slices, c0.slice_limit, c0.mem_used) == (4, 2, 8), c0
    assert set(snap.reservations) == {"p0", "p1", "p2", "p3"}
    assert violations(snap, allow_overcommit=True) == []
    assert await new[2].reconcile_all() == {}, "the over-full card is repaired on every pass"
    # no new slice on card 0: the filter's fit, the reserve script, explain
    req = pod_request(slice_pod((2, 1)), cfg)
    assert req is not None
    got = fit(snap.states(), req, {}, "binpack")
    assert got.cards == (1,), got
    refused, _ = await ledger.reserve("n", "x", [0], 2, 1, 1, pod="ns/x")
    assert not refused.ok and "CardTimeSlicingExhausted" in refused.reason, refused
    why = explain("ns/x", req, {}, {"n": snap}, "binpack")
    card0 = next(c for c in why.nodes[0].cards if c.index == 0)
    assert "CardTimeSlicingExhausted" in card0.reason, card0
