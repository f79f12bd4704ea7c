"""The extenders' gate on the watchers' stamp (shared/domain/upkeep.py), by table."""

from __future__ import annotations

import pytest

from shared.config import Config
from shared.domain.upkeep import KEEP_EVERY_SECONDS, LOST_AFTER_MIN, READ_EVERY_SECONDS, unkept_problem


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
