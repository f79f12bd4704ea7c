"""The extenders' gate on the watchers' stamp (shared/domain/upkeep.py), by table."""

from __future__ import annotations

import pytest

from shared.config import Config
from shared.domain.upkeep import (
    KEEP_EVERY_SECONDS,
    LOST_AFTER_MIN,
    READ_EVERY_SECONDS,
    Seen,
    age_of,
    seen_again,
    unkept_problem,
)


@pytest.mark.parametrize(("age_ms", "lost_after", "refused"), [
    (None, 90, False),  # no stamp: Redis restarted empty, or watchers that do not stamp yet
    (0, 90, False),
    (89_999, 90, False),
    (90_000, 90, False),  # exactly the limit: still kept
    (90_001, 90, True),
    (3_600_000, 90, True),
    (31_000, 30, True),
    (29_000, 30, False),
])
def test_refused_only_past_the_limit(age_ms: int | None, lost_after: int, refused: bool) -> None:
    assert bool(unkept_problem(age_ms, lost_after)) is refused


def test_the_refusal_names_the_age_the_setting_and_what_to_look_at() -> None:
    why = unkept_problem(125_400, 90)
    assert "for 125 s" in why and "watchersLostAfterSeconds is 90" in why
    assert "watcher pods down" in why and "another Redis or keyPrefix" in why


def test_a_missed_stamp_or_two_refuses_nothing() -> None:
    # the shortest limit allowed outlasts two missed stamps and an extender's read between them
    assert LOST_AFTER_MIN > 2 * KEEP_EVERY_SECONDS + READ_EVERY_SECONDS
    assert Config().watchers_lost_after_seconds >= LOST_AFTER_MIN


@pytest.mark.parametrize(("last", "stamp", "age_ms", "now", "seen"), [
    (None, None, None, 100.0, None),  # never read one: no verdict
    (None, 5000, 2000, 100.0, Seen(5000, 98.0)),  # first read: dated by Redis's count
    (Seen(5000, 98.0), 5000, 12_000, 108.0, Seen(5000, 96.0)),  # same stamp, Redis counts longer: its count
    (Seen(5000, 98.0), 5000, 0, 400.0, Seen(5000, 98.0)),  # same stamp, Redis's clock stepped back: ours
    (Seen(5000, 98.0), 15_000, 1000, 110.0, Seen(15_000, 109.0)),  # a new stamp: dated anew
    (Seen(5000, 98.0), 1000, 0, 110.0, Seen(1000, 110.0)),  # a new stamp from a clock behind: dated anew
    (Seen(5000, 98.0), None, None, 400.0, Seen(5000, 98.0)),  # gone or unreadable: what was seen ages on
    (Seen(5000, 98.0), 5000, None, 400.0, Seen(5000, 98.0)),
])
def test_a_stamp_is_dated_on_the_extenders_clock(last: Seen | None, stamp: int | None, age_ms: int | None,
                                                 now: float, seen: Seen | None) -> None:
    assert seen_again(last, stamp, age_ms, now) == seen


def test_the_age_is_counted_on_the_extenders_clock() -> None:
    assert age_of(None, 100.0) is None
    assert age_of(Seen(5000, 98.0), 400.0) == 302_000
    assert unkept_problem(age_of(Seen(5000, 98.0), 400.0), 90)  # a stamp stuck since, whatever Redis says
