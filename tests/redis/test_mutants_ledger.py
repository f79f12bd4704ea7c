"""Ledger script rules no other test pinned down (red team, mutants): each case names the small bug in
shared/store/lua/ it guards against, and fails with that bug in place.

Edges on Redis's own clock cannot be hit to the millisecond from outside, but `keep_from` is the caller's
instant: replace_node's `settles` is checked at its exact edge through it."""

from __future__ import annotations

import pytest

from shared.domain.annotations import PodUsage
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


async def test_a_uid_booked_without_idle_is_not_answered_for_an_idle_ask(ledger: Ledger) -> None:
    # mutant: reserve.lua's "booked with other amounts" check leaves out `idle` (mutex or a whole card): a bind
    # asking an idle card would be answered with the earlier booking on a shared card
    await ledger.upsert_node(inventory("idle", S4000))
    assert (await ledger.reserve("idle", "u1", [0], 8, 2, 1))[0].ok
    out, _ = await ledger.reserve("idle", "u1", [0], 8, 2, 1, whole=True)
    assert not out.ok and "booked with other amounts" in out.reason and "idle" in out.reason
    again, _ = await ledger.reserve("idle", "u1", [0], 8, 2, 1)  # the same ask as booked: answered as existing
    assert again.ok and again.existing


async def test_slices_past_the_limit_alone_are_reported_as_over_commit(ledger: Ledger) -> None:
    # mutant: _lib.lua `overcommitted` leaves slices out: a record putting a 3rd slice on a max_inst 2 card (memory
    # and cores within bounds) was booked without the over-commit the watchers alert on
    await ledger.upsert_node(inventory("inst", S4000, slice_limit=2))
    for uid in ("a", "b"):
        assert (await ledger.observe(uid, PodUsage("inst", (0,), 8, 2, 1)))["overcommit"] is False
    out = await ledger.observe("c", PodUsage("inst", (0,), 8, 2, 1))
    assert out["ok"] and out["overcommit"] is True


async def test_a_card_no_longer_reported_stays_while_slices_alone_hold_it(ledger: Ledger) -> None:
    # mutant: write_cards keeps a card no longer reported while memory or cores are held, not slices: a holder of
    # slices alone (a record the API server carries) would vanish from the ledger with its card
    await ledger.upsert_node(inventory("gone", S4000))
    assert (await ledger.observe("h", PodUsage("gone", (1,), 0, 0, 1)))["ok"]
    await ledger.upsert_node(inventory("gone", S4000, n=1))  # card 1 no longer reported
    snap = await ledger.snapshot("gone")
    assert snap is not None and snap.cards[1].health == "removed" and snap.cards[1].slices == 1
    assert "h" in snap.reservations


async def test_a_changed_record_of_a_bound_booking_is_kept_out_with_keep_bound(ledger: Ledger) -> None:
    # mutant: observe.lua ignores keep_bound: a record edited after our bind (moved to card 1, grown to 96 units)
    # would replace the booking our bind made and wrote
    await ledger.upsert_node(inventory("kb", S4000))
    assert (await ledger.reserve("kb", "u1", [0], 8, 2, 1))[0].ok
    await ledger.mark_bound("kb", "u1")
    out = await ledger.observe("u1", PodUsage("kb", (1,), 96, 16, 1), keep_bound=True)
    assert out["kept"] is True and out["changed"] is False
    assert out["booked"] == {"cards": "0", "mem": 8, "cores": 2, "slices": 1}
    snap = await ledger.snapshot("kb")
    assert snap is not None and snap.reservations["u1"].cards == (0,)
    assert (snap.cards[0].mem_used, snap.cards[1].mem_used) == (8, 0)
    # without keep_bound the API's record is the truth and is booked
    assert (await ledger.observe("u1", PodUsage("kb", (1,), 96, 16, 1)))["changed"] is True


async def test_a_uid_booked_on_one_card_is_not_answered_for_two(ledger: Ledger) -> None:
    # mutant: reserve.lua's "booked with other amounts" check leaves out the number of cards: a pod's booking of
    # one card would be answered for a two-card ask, and its Binding would carry a record the ledger does not book
    await ledger.upsert_node(inventory("twice", S4000))
    assert (await ledger.reserve("twice", "u1", [0], 96, 16, 1, whole=True))[0].ok
    out, _ = await ledger.reserve("twice", "u1", [0, 1], 96, 16, 1, whole=True)
    assert not out.ok and "booked with other amounts: 1 card(s)" in out.reason and "asked 2 card(s)" in out.reason
    snap = await ledger.snapshot("twice")
    assert snap is not None and snap.reservations["u1"].cards == (0,) and snap.cards[1].mem_used == 0


async def test_a_record_moved_to_another_card_with_the_same_amounts_is_booked_there(ledger: Ledger) -> None:
    # mutant: observe.lua takes a record of the same amounts as the booking it has, whatever its cards: a record
    # naming card 1 would leave the booking on card 0 (card 1 offered free while the pod holds it)
    await ledger.upsert_node(inventory("moved", S4000))
    assert (await ledger.observe("u1", PodUsage("moved", (0,), 8, 2, 1)))["changed"] is True
    assert (await ledger.observe("u1", PodUsage("moved", (1,), 8, 2, 1)))["changed"] is True
    snap = await ledger.snapshot("moved")
    assert snap is not None and snap.reservations["u1"].cards == (1,)
    assert (snap.cards[0].mem_used, snap.cards[1].mem_used) == (0, 8)


async def test_a_kept_pending_booking_over_the_slice_limit_is_counted_over_full(ledger: Ledger) -> None:
    # mutant: replace_node counts a kept pending booking as over-filling its card by memory and cores only, not by
    # slice instances past the card's limit
    await ledger.upsert_node(inventory("full", S4000, slice_limit=2))
    assert (await ledger.reserve("full", "p1", [0], 8, 2, 1))[0].ok  # pending: a binder may be mid-flight
    bound = {uid: (PodUsage("full", (0,), 8, 2, 1), f"ns/{uid}") for uid in ("b1", "b2")}
    out = await ledger.replace_node(inventory("full", S4000, slice_limit=2), bound, keep_ms=10_000)
    assert out["pending_kept"] == 1 and out["pending_overfull"] == 1
    snap = await ledger.snapshot("full")
    assert snap is not None and snap.cards[0].slices == 3 and snap.cards[0].mem_used == 24


async def test_a_kept_bound_booking_keeps_its_bound_stamp_through_a_rewrite(ledger: Ledger) -> None:
    # mutant: replace_node re-books a kept bound reservation stamped bound when it was made: its keep window would
    # end early, and the next rewrite would free a booking bound seconds ago
    await ledger.upsert_node(inventory("stamp", S4000))
    assert (await ledger.reserve("stamp", "u1", [0], 8, 2, 1))[0].ok
    now = await ledger.redis_time_ms()
    await ledger.redis.hset(ledger.keys.res("stamp", "u1"),  # type: ignore[misc]
                            mapping={"state": "bound", "created": now - 30_000, "bound_at": now - 2_000})
    for _ in range(2):
        out = await ledger.replace_node(inventory("stamp", S4000), {}, keep_ms=10_000)
        assert out["pending_kept"] == 1 and out["dropped"] == 0
        snap = await ledger.snapshot("stamp")
        assert snap is not None and snap.reservations["u1"].bound_at == now - 2_000


async def test_a_kept_pending_booking_keeps_its_bind_attempt_through_a_rewrite(ledger: Ledger) -> None:
    # mutant: replace_node re-books a kept pending reservation without its settle_by and binds: the janitor could
    # release it while the Binding of the attempt may still be committed, and an earlier attempt's give-back would
    # free what a later attempt is binding with
    await ledger.upsert_node(inventory("hold", S4000))
    first, _ = await ledger.reserve("hold", "u1", [0], 8, 2, 1, hold_ms=30_000)
    second, _ = await ledger.reserve("hold", "u1", [0], 8, 2, 1, hold_ms=30_000)
    assert first.ok and second.ok and second.existing and second.bind_no == 2
    await ledger.replace_node(inventory("hold", S4000), {}, keep_ms=10_000)
    snap = await ledger.snapshot("hold")
    assert snap is not None and snap.reservations["u1"].settle_by == second.settle_by > 0
    assert (await ledger.give_back("hold", "u1", bind_no=first.bind_no))[0] == "kept"
    assert (await ledger.give_back("hold", "u1", bind_no=second.bind_no))[0] == "released"


async def test_keep_ms_and_keep_from_together_keep_what_either_keeps(ledger: Ledger) -> None:
    # mutant: replace_node takes keep_from alone when both are given (not the earlier of the two instants): a
    # booking bound 5 s ago, inside the 10 s window, would be freed by a keep_from of now
    await ledger.upsert_node(inventory("both", S4000))
    assert (await ledger.reserve("both", "u1", [0], 8, 2, 1))[0].ok
    now = await ledger.redis_time_ms()
    await ledger.redis.hset(ledger.keys.res("both", "u1"),  # type: ignore[misc]
                            mapping={"state": "bound", "created": now - 5_000, "bound_at": now - 5_000})
    out = await ledger.replace_node(inventory("both", S4000), {}, keep_ms=10_000, keep_from=now)
    assert out["pending_kept"] == 1 and out["dropped"] == 0


async def test_keep_bound_keeps_a_booking_whose_record_differs_in_slices_alone(ledger: Ledger) -> None:
    # mutant: replace_node's keep_bound compares cards, memory and cores but not slices
    await ledger.upsert_node(inventory("kslices", S4000))
    assert (await ledger.reserve("kslices", "u1", [0], 8, 2, 1))[0].ok
    await ledger.mark_bound("kslices", "u1")
    record = {"u1": (PodUsage("kslices", (0,), 8, 2, 2), "ns/u1")}
    out = await ledger.replace_node(inventory("kslices", S4000), record, keep_bound=True)
    assert out["kept_bound"] == ["u1"]
    snap = await ledger.snapshot("kslices")
    assert snap is not None and snap.reservations["u1"].slices == 1 and snap.cards[0].slices == 1


async def test_a_later_bind_attempt_with_a_shorter_hold_never_lowers_settle_by(ledger: Ledger) -> None:
    # mutant: reserve.lua sets a repeated booking's settle_by to this attempt's now + hold_ms: a shorter hold would
    # cut short the time an earlier attempt's Binding may still be committed, and the janitor could free the card
    await ledger.upsert_node(inventory("hold2", S4000))
    first, _ = await ledger.reserve("hold2", "u1", [0], 8, 2, 1, hold_ms=30_000)
    second, _ = await ledger.reserve("hold2", "u1", [0], 8, 2, 1, hold_ms=1_000)
    assert first.ok and second.ok and second.existing
    assert second.settle_by == first.settle_by  # the earlier, later-ending hold stands
    snap = await ledger.snapshot("hold2")
    assert snap is not None and snap.reservations["u1"].settle_by == first.settle_by


async def test_a_removed_card_is_deleted_only_once_nothing_holds_it_slices_included(ledger: Ledger) -> None:
    # mutant: _lib.lua add_usage deletes a removed card once its memory and cores are given back, slices aside
    await ledger.upsert_node(inventory("rm", S4000))
    assert (await ledger.observe("a", PodUsage("rm", (1,), 8, 2, 1)))["ok"]
    assert (await ledger.observe("b", PodUsage("rm", (1,), 0, 0, 1)))["ok"]
    await ledger.upsert_node(inventory("rm", S4000, n=1))  # card 1 no longer reported: kept as removed
    assert await ledger.release("rm", "a")
    snap = await ledger.snapshot("rm")
    assert snap is not None and 1 in snap.cards and snap.cards[1].health == "removed" and snap.cards[1].slices == 1
    assert await ledger.release("rm", "b")
    snap = await ledger.snapshot("rm")
    assert snap is not None and 1 not in snap.cards  # now nothing holds it: gone
