"""The ledger's time rules at their exact edges, which the Lua twin tables (run against Redis's live clock) stay
seconds away from (red team, mutants).

Each case names the small bug it guards against: with the bug in shared/domain/reconcile.py the case fails.
"""

from __future__ import annotations

import pytest

from shared.domain.reconcile import FUTURE_MS, expires, in_flight, restamps, settles
from shared.domain.state import Reservation

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
