"""The node watcher's coalescing (shared/domain/coalesce.py): collapse, deletions, the minimum interval, fairness.

Each case is a script of steps at given times: ("offer", key, value, now[, deleted]) -> expected Offered;
("take", now) -> expected (key, value, gone) or None; ("wait", now) -> expected seconds or None.
"""

from __future__ import annotations

from typing import Any

import pytest

from shared.domain.coalesce import Coalescer, Offered

R, D, C = Offered.READY, Offered.DEFERRED, Offered.COALESCED
CASES: dict[str, list[tuple[Any, ...]]] = {
    "quiet key goes straight through": [
        ("offer", "a", 1, 0.0, False, R), ("wait", 0.0, 0.0), ("take", 0.0, ("a", 1, None)), ("take", 0.0, None),
        ("wait", 0.0, None),
    ],
    "a burst collapses to the newest": [
        ("offer", "a", 1, 0.0, False, R), ("offer", "a", 2, 0.0, False, C), ("offer", "a", 3, 0.1, False, C),
        ("take", 0.1, ("a", 3, None)), ("take", 0.1, None),
    ],
    "a key taken recently waits the interval": [
        ("offer", "a", 1, 0.0, False, R), ("take", 0.0, ("a", 1, None)),
        ("offer", "a", 2, 0.2, False, D), ("offer", "a", 3, 0.3, False, C),
        ("wait", 0.3, 0.7), ("take", 0.5, None), ("take", 1.0, ("a", 3, None)),
        ("offer", "a", 4, 2.5, False, R),  # quiet for longer than the interval: ready at once
    ],
    "a deletion is the newest state": [
        ("offer", "a", "v1", 0.0, False, R), ("offer", "a", "del", 0.0, True, C), ("take", 0.0, ("a", "del", None)),
    ],
    "created again after a deletion: the deletion is handled first": [
        ("offer", "a", "del", 0.0, True, R), ("offer", "a", "new-uid", 0.0, False, C),
        ("offer", "a", "new-uid-2", 0.0, False, C), ("take", 0.0, ("a", "new-uid-2", "del")),
    ],
    "deleted again: the superseded deletion is moot": [
        ("offer", "a", "del", 0.0, True, R), ("offer", "a", "new", 0.0, False, C),
        ("offer", "a", "del2", 0.0, True, C), ("take", 0.0, ("a", "del2", None)),
    ],
    "ready keys go in the order of their first pending event": [
        ("offer", "a", 1, 0.0, False, R), ("offer", "b", 1, 0.0, False, R), ("offer", "a", 2, 0.0, False, C),
        ("offer", "c", 1, 0.0, False, R), ("offer", "b", 2, 0.0, False, C),
        ("take", 0.0, ("a", 2, None)), ("take", 0.0, ("b", 2, None)), ("take", 0.0, ("c", 1, None)),
    ],
    "a hot key cannot starve the others": [
        ("offer", "hot", 1, 0.0, False, R), ("take", 0.0, ("hot", 1, None)),
        ("offer", "hot", 2, 0.1, False, D), ("offer", "x", 1, 0.2, False, R),
        ("take", 0.2, ("x", 1, None)),  # the hot key waits its interval; the other goes now
        ("offer", "y", 1, 0.5, False, R), ("offer", "hot", 3, 0.6, False, C),
        ("take", 1.1, ("hot", 3, None)),  # due now, and first in line (pending since 0.1)
        ("take", 1.1, ("y", 1, None)),
    ],
}


@pytest.mark.parametrize("steps", CASES.values(), ids=CASES.keys())
def test_coalescer(steps: list[tuple[Any, ...]]) -> None:
    c: Coalescer[Any] = Coalescer(1.0)
    for i, step in enumerate(steps):
        if step[0] == "offer":
            _, key, value, now, deleted, want = step
            assert c.offer(key, value, now, deleted) == want, f"step {i}: {step}"
        elif step[0] == "take":
            _, now, want = step
            p = c.take(now)
            got = None if p is None else (p.key, p.value, p.gone)
            assert got == want, f"step {i}: {step}"
        else:
            _, now, want = step
            assert c.wait(now) == (None if want is None else pytest.approx(want)), f"step {i}: {step}"


def test_put_back_keeps_its_place_unless_superseded() -> None:
    c: Coalescer[str] = Coalescer(1.0)
    c.offer("a", "a1", 0.0)
    c.offer("b", "b1", 0.0)
    p = c.take(0.0)
    assert p is not None and p.key == "a"
    c.put_back(p)  # not handled (Redis away): first in line again, ready at once
    first = c.take(0.0)
    assert first is not None and (first.key, first.value) == ("a", "a1")
    c.offer("a", "del", 0.1, deleted=True)  # deferred (taken at 0.0)
    taken = c.take(1.0)
    assert taken is not None and taken.key == "b"
    taken = c.take(1.0)
    assert taken is not None and (taken.value, taken.deleted) == ("del", True)
    c.offer("a", "a2", 1.1)  # a newer state while the deletion was handled, which then failed
    c.put_back(taken)
    newer = c.take(2.0)
    assert newer is not None and (newer.value, newer.gone) == ("a2", "del"), "the deletion is kept, before the newer"


def test_clear_drops_pending_and_keeps_the_interval() -> None:
    c: Coalescer[int] = Coalescer(1.0)
    c.offer("a", 1, 0.0)
    assert c.take(0.0) is not None
    c.offer("a", 2, 0.1)
    c.offer("b", 1, 0.1)
    c.clear()  # a re-list: its view supersedes every pending event
    assert len(c) == 0 and c.wait(0.1) is None and c.take(5.0) is None
    assert c.offer("a", 3, 0.2) == Offered.DEFERRED, "a node handled just now still waits its interval"


def test_taken_times_stay_bounded() -> None:
    c: Coalescer[int] = Coalescer(1.0)
    for i in range(10_000):
        c.offer(f"n{i}", i, float(i))
        assert c.take(float(i)) is not None
    assert len(c._taken) <= 128


def test_put_back_with_a_due_time_waits_and_lets_the_others_go() -> None:
    c: Coalescer[str] = Coalescer(1.0)
    c.offer("bad", "b1", 0.0)
    c.offer("ok", "o1", 0.0)
    p = c.take(0.0)
    assert p is not None and p.key == "bad"
    c.put_back(p, due=1.0)  # failed for a reason no retry cures soon: not first in line again at once
    assert c.wait(0.0) == 0.0
    other = c.take(0.0)
    assert other is not None and other.key == "ok"
    assert c.take(0.5) is None and c.wait(0.5) == pytest.approx(0.5)
    assert c.offer("bad", "b2", 0.6) == Offered.COALESCED, "pending still: a newer state takes its place"
    again = c.take(1.0)
    assert again is not None and (again.key, again.value) == ("bad", "b2")
