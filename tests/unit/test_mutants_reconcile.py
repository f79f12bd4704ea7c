"""The ledger's time rules at their exact edges, which the Lua twin tables (run against Redis's live clock) stay
seconds away from (red team, mutants).

Each case names the small bug it guards against: with the bug in shared/domain/reconcile.py the case fails.
"""

from __future__ import annotations

import pytest

from shared.domain.knobs import CardKnobs
from shared.domain.node import Card, Inventory
from shared.domain.reconcile import FUTURE_MS, diff_node, expires, in_flight, restamps, settles, summarize
from shared.domain.state import CardRecord, NodeSnapshot, Reservation

NOW = 1_800_000_000_000  # ms, Redis's clock
TTL = 30_000


def res(state: str = "pending", created: int = NOW, bound_at: int = 0, settle_by: int = 0) -> Reservation:
    return Reservation("u1", (0,), 2, 1, 1, state, created, bound_at, settle_by=settle_by)


# mutant: `stamp >= keep_from` read as `>`: a booking made at the very instant the caller's truth begins is newer
# than that truth's start and must settle (replace_node keeps it), not be judged by it
@pytest.mark.parametrize(("bound_at", "keep_from", "want"), [
    (NOW - 5_000, NOW - 5_000, True),  # the edge: kept
    (NOW - 5_001, NOW - 5_000, False),
    (NOW + FUTURE_MS, NOW - 5_000, True),  # as far ahead as a stamp may be and still count
    (NOW + FUTURE_MS + 1, NOW - 5_000, False),  # a clock that jumped: settles nothing
])
def test_a_bound_booking_settles_from_the_instant_of_the_keep_window(bound_at: int, keep_from: int,
                                                                     want: bool) -> None:
    assert settles(res("bound", created=NOW - 60_000, bound_at=bound_at), NOW, keep_from) is want


# mutant: `settle_by >= now` read as `>`: a bind attempt's Binding may still be committed at its settle_by itself
@pytest.mark.parametrize(("settle_by", "want"), [
    (NOW, True), (NOW - 1, False), (NOW + FUTURE_MS, True), (NOW + FUTURE_MS + 1, False), (0, False)])
def test_a_binding_is_in_flight_up_to_and_at_its_settle_by(settle_by: int, want: bool) -> None:
    assert in_flight(res(settle_by=settle_by), NOW) is want


# mutant: `now - created > ttl` read as `>=`: a pending booking is released only once it is older than its TTL
@pytest.mark.parametrize(("age", "want"), [(TTL, False), (TTL + 1, True), (TTL - 1, False)])
def test_a_pending_booking_expires_only_past_its_ttl(age: int, want: bool) -> None:
    assert expires(res(created=NOW - age), NOW, TTL) is want
    assert expires(res("bound", created=NOW - age), NOW, TTL) is False


# mutant: restamps reads `created` only; a later bind attempt's settle_by stamped ahead is a clock that stepped back
# too: such a booking is stamped anew, not released (its Binding may be in flight)
@pytest.mark.parametrize(("created", "settle_by", "want"), [
    (NOW - 600_000, NOW + FUTURE_MS + 1, True),
    (NOW + FUTURE_MS + 1, 0, True),
    (NOW - 600_000, NOW + FUTURE_MS, False),
    (NOW + FUTURE_MS, 0, False),
])
def test_a_stamp_ahead_of_the_clock_is_restamped_not_released(created: int, settle_by: int, want: bool) -> None:
    r = res(created=created, settle_by=settle_by)
    assert restamps(r, NOW) is want
    if want:
        assert expires(r, NOW, TTL) is False  # however old its `created` says it is
    assert restamps(res("bound", created=created, settle_by=settle_by), NOW) is False


# --- diff_node: what the card table shows must be repaired too ------------------------------------------------

N = "n1"


def knob_inventory(knobs: CardKnobs | None) -> Inventory:
    return Inventory(N, (Card(N, 0, 96, knobs.max_inst if knobs else 16, knobs=knobs),))


def knob_snapshot(policy: int | None, time_slice: int | None = 1, ratio: int | None = 100,
                  mem_free: int = 96) -> NodeSnapshot:
    rec = CardRecord(0, 96, 0, mem_free, 16, 0, 16, 0, 16, "ok", policy, time_slice, ratio)
    return NodeSnapshot(N, 3, "", {0: rec}, {})


# mutant: diff_node leaves the knobs out of its card comparison (the card table showed stale knobs for good)
@pytest.mark.parametrize(("snapshot", "knobs", "differs"), [
    (knob_snapshot(0), CardKnobs(16, 0, 1, 100), False),
    (knob_snapshot(0), CardKnobs(16, 2, 1, 100), True),  # policy changed
    (knob_snapshot(0, time_slice=1), CardKnobs(16, 0, 4, 100), True),
    (knob_snapshot(0, ratio=100), CardKnobs(16, 0, 1, 110), True),
    (knob_snapshot(None, None, None), CardKnobs(16, 0, 1, 100), True),  # first published
    (knob_snapshot(0), None, True),  # no longer published
    (knob_snapshot(None, None, None), None, False),
])
def test_a_change_of_knobs_alone_is_a_card_difference(snapshot: NodeSnapshot, knobs: CardKnobs | None,
                                                      differs: bool) -> None:
    d = diff_node(N, snapshot, knob_inventory(knobs), {}, NOW, 10_000)
    assert summarize(d.differences) == ({"card": 1} if differs else {}), [x.detail for x in d.differences]


# mutant: diff_node compares used amounts but not the free ones the scripts keep beside them (a hand-edited or torn
# mem_free would offer memory the card does not have)
def test_a_drifted_free_amount_is_a_usage_difference() -> None:
    d = diff_node(N, knob_snapshot(None, None, None, mem_free=90), knob_inventory(None), {}, NOW, 10_000)
    assert summarize(d.differences) == {"usage": 1}
