"""Ledger script rules no other test pinned down (red team, mutants): each case names the small bug in
shared/store/lua/ it guards against, and fails with that bug in place.

Edges on Redis's own clock cannot be hit to the millisecond from outside, but `keep_from` is the caller's
instant: replace_node's `settles` is checked at its exact edge through it."""

from __future__ import annotations

import pytest

from shared.store.ledger import Ledger
from tests.redis.helpers import S4000, inventory

pytestmark = pytest.mark.redis


@pytest.mark.parametrize(("past_edge", "kept"), [(0, True), (1, False)])
async def test_a_booking_bound_at_the_instant_keep_from_names_is_kept(ledger: Ledger, past_edge: int,
                                                                      kept: bool) -> None:
    # mutant: _lib.lua settles `stamp >= keep_from` read as `>` (the twin of reconcile.settles)
    node = f"edge{past_edge}"
    await ledger.upsert_node(inventory(node, S4000))
    assert (await ledger.reserve(node, "u1", [0], 8, 2, 1))[0].ok
    now = await ledger.redis_time_ms()
    bound_at = now - 5_000
    await ledger.redis.hset(ledger.keys.res(node, "u1"),  # type: ignore[misc]
                            mapping={"state": "bound", "created": bound_at - 10_000, "bound_at": bound_at})
    out = await ledger.replace_node(inventory(node, S4000), {}, keep_from=bound_at + past_edge)
    assert out["pending_kept"] == (1 if kept else 0) and out["dropped"] == (0 if kept else 1)
    snap = await ledger.snapshot(node)
    assert snap is not None and ("u1" in snap.reservations) is kept
    assert snap.cards[0].mem_used == (8 if kept else 0)


@pytest.mark.parametrize("health", ["weird", "", "OK"])
async def test_a_card_whose_health_names_no_state_is_refused(ledger: Ledger, health: str) -> None:
    # mutant: _lib.lua card_rule drops `health ~= "ok" -> CardNotHealth`: a damaged (hand-edited) health field would
    # read as a healthy card, where every other damaged field fails closed
    node = f"sick-{health or 'empty'}"
    await ledger.upsert_node(inventory(node, S4000))
    await ledger.redis.hset(ledger.keys.card(node, 0), "health", health)  # type: ignore[misc]
    out, _ = await ledger.reserve(node, "u1", [0], 8, 2, 1)
    assert not out.ok and out.reason == "CardNotHealth"
    assert (await ledger.reserve(node, "u2", [1], 8, 2, 1))[0].ok  # the other card is unharmed
