"""Red team (a node's cards changing under bound pods): a random walk of one node's inventory (cards added and
dropped, other ids, S4000 <-> S5000, slice limits lowered, cards cordoned or unhealthy, the node in error, deleted
and created again) interleaved with bookings, confirmations and releases, on the real scripts.

After every step: the cards' usage is exactly the sum of the reservations on them, free is capacity - used, a
card no longer reported stays (as `removed`) only while something holds it, and a booking the reserve script
accepts never takes a card past its capacity, cores or slice limit. At the end every release succeeds and nothing
is left. (It held: kept as a regression test.)"""

from __future__ import annotations

import random

import pytest

from shared.domain.node import Card, Inventory
from shared.store.ledger import Ledger
from tests.redis.helpers import violations

pytestmark = pytest.mark.redis
NODE = "walk"


def random_inventory(rng: random.Random) -> Inventory:
    if rng.random() < 0.1:
        return Inventory(NODE, error="mthreads.com/sgpu-core allocatable '16' is below (capacity 32): ...")
    model = rng.choice((96, 160))
    ids = sorted(rng.sample(range(8), rng.randint(1, 8)))
    limit = rng.choice((1, 2, 4, 16))
    return Inventory(NODE, tuple(Card(NODE, i, model, limit, healthy=rng.random() > 0.1,
                                      cordoned=rng.random() < 0.1) for i in ids))


@pytest.mark.parametrize("seed", range(4))
async def test_a_nodes_cards_changing_under_bookings_keep_the_ledger_whole(ledger: Ledger, seed: int) -> None:
    rng = random.Random(seed)
    await ledger.upsert_node(random_inventory(rng))
    booked: set[str] = set()
    for step in range(300):
        snap = await ledger.snapshot(NODE)
        op = rng.random()
        if op < 0.15 or snap is None:
            await ledger.upsert_node(random_inventory(rng))
        elif op < 0.2:
            if await ledger.remove_node(NODE, keep_ms=0) is not None:  # (kept while a booking is pending)
                booked.clear()
            await ledger.upsert_node(random_inventory(rng))
        elif op < 0.6 and snap.cards:
            idx = rng.choice(sorted(snap.cards))
            before = snap.cards[idx]
            uid = f"u{step}"
            mem, cores = rng.choice((2, 4, 8, 16, 32, 64)), rng.randint(1, 16)
            out, _ = await ledger.reserve(NODE, uid, [idx], mem, cores, 1, pod=f"ns/{uid}")
            if out.ok:
                booked.add(uid)
                after = (await ledger.snapshot(NODE)).cards[idx]  # type: ignore[union-attr]
                assert before.health == "ok", (step, before)
                assert after.mem_used <= after.capacity and after.cores_used <= after.cores, (step, before, after)
                assert after.slices <= after.slice_limit, (step, before, after)
        elif op < 0.75 and booked:
            await ledger.mark_bound(NODE, rng.choice(sorted(booked)))
        elif booked:
            uid = rng.choice(sorted(booked))
            assert await ledger.release(NODE, uid), (step, uid)
            booked.discard(uid)
        snap = await ledger.snapshot(NODE)
        if snap is not None:
            assert not violations(snap, allow_overcommit=True), (step, violations(snap, allow_overcommit=True))
            assert set(snap.reservations) == booked, step
    for uid in sorted(booked):
        assert await ledger.release(NODE, uid), uid
    snap = await ledger.snapshot(NODE)
    assert snap is not None and not snap.reservations and not violations(snap)
    assert all(c.health != "removed" and c.mem_used == c.cores_used == c.slices == 0 for c in snap.cards.values())
