"""Which of a list and a watch event is newer (shared/domain/resource_version.py), and the queue's drop of the events a
newer list superseded (shared/domain/coalesce.py `drop`, used by NodeWatcher.supersede after a rebuild)."""

from __future__ import annotations

import pytest

from shared.domain.coalesce import Coalescer
from shared.domain.resource_version import listed_over, rv_number


@pytest.mark.parametrize(("rv", "number"), [
    ("1", 1), ("12345678901234567890", 12345678901234567890), ("", None), ("0", None), ("007", None),
    ("-3", None), ("1.5", None), ("abc", None), ("١٢", None), (" 12", None),
])
def test_only_positive_integers_without_leading_zeros_are_comparable(rv: str, number: int | None) -> None:
    assert rv_number(rv) == number


@pytest.mark.parametrize(("event", "listed", "before", "over"), [
    ("20", "30", False, True),  # older than the list, however late it came (a lagging stream)
    ("30", "30", False, True),  # the very state listed
    ("31", "30", True, False),  # newer, by the numbers
    ("9", "10", True, True),  # (numbers, not text: "9" > "10" as text)
    ("opaque-a", "30", True, True),  # not comparable: received before the list was requested, so no newer
    ("opaque-a", "30", False, False),  # received after: it may be newer, handled
    ("20", "", True, True), ("20", "", False, False), ("", "", False, False),
])
def test_listed_over(event: str, listed: str, before: bool, over: bool) -> None:
    assert listed_over(event, listed, before) is over


def test_drop_removes_the_stale_keys_and_the_others_keep_their_places() -> None:
    q: Coalescer[str] = Coalescer(1.0)
    q.offer("a", "a1", 0.0)
    q.offer("b", "b1", 0.0)
    mark = q.offers
    q.offer("c", "c1", 0.0)
    q.offer("a", "a2", 0.0)  # a's newest value came after the mark: kept, in its first place
    assert sorted(q.drop(lambda p: p.offered <= mark)) == ["b"]
    assert len(q) == 2
    taken = [q.take(0.0), q.take(0.0), q.take(0.0)]
    assert [(p.key, p.value) if p else None for p in taken] == [("a", "a2"), ("c", "c1"), None]
    # a dropped key offered again is pending once more, ready at once (never taken)
    q.drop(lambda p: True)
    q.offer("b", "b2", 0.0)
    p = q.take(0.0)
    assert p is not None and (p.key, p.value) == ("b", "b2") and q.take(0.0) is None
