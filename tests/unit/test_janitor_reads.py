"""The janitor's reads of pods, judged (shared/domain/janitor_reads.py): which pending bookings past the TTL have their
pod read from the API server before expiry, and what each answer means; and the bound on a stale booking's life that
follows from the sweeps and the reads (shared/domain/timing.py)."""

from __future__ import annotations

from typing import Any

import pytest

from shared.domain.janitor_reads import KEPT, Answer, Verdict, after_read, answered, before_read, holds_reads
from shared.domain.timing import (
    API_HOLDS_READ_S,
    API_HOLDS_READS,
    JANITOR_INTERVAL_S,
    janitor_rest_s,
    janitor_sweep_s,
    pending_release_bound_s,
)


def pod(uid: str = "u1", node: str = "n1", phase: str = "Running") -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns", "uid": uid}, "spec": {"nodeName": node},
            "status": {"phase": phase}}


BEFORE: list[tuple[str, str, str | None, bool, Verdict]] = [
    # what: ref, the node the view holds the pod bound on, reads held back -> verdict
    ("a pod no view holds, reads free", "ns/p", None, False, "read"),
    ("a pod the view holds bound there", "ns/p", "n1", False, "view_bound"),
    ("bound there in the view, reads held back: kept unread all the same", "ns/p", "n1", True, "view_bound"),
    ("a pod the view holds bound elsewhere: only the API server can say", "ns/p", "n2", False, "read"),
    ("reads held back after an unanswered one", "ns/p", None, True, "api_unanswered"),
    ("bound elsewhere in the view, reads held back", "ns/p", "n2", True, "api_unanswered"),
    ("no pod name recorded", "", None, False, "expire"),
    ("no namespace", "/p", None, False, "expire"),
    ("no name", "ns/", None, True, "expire"),
    ("no name, the view has a pod of that uid there: nothing in the API can hold it", "ns/", "n1", False, "expire"),
]


@pytest.mark.parametrize(("ref", "view_node", "held", "verdict"), [b[1:] for b in BEFORE], ids=[b[0] for b in BEFORE])
def test_before_read(ref: str, view_node: str | None, held: bool, verdict: Verdict) -> None:
    assert before_read("n1", ref, view_node, held) == verdict


AFTER: list[tuple[str, Answer, Verdict, bool, bool]] = [
    # what: answer -> verdict, whether it ends an episode of unanswered reads, whether it holds the rest back
    ("bound there", pod(), "api_bound", True, False),
    ("bound there, pending phase", pod(phase="Pending"), "api_bound", True, False),
    ("gone", 404, "expire", True, False),
    ("another pod of that name", pod(uid="u2"), "expire", True, False),
    ("succeeded", pod(phase="Succeeded"), "expire", True, False),
    ("failed", pod(phase="Failed"), "expire", True, False),
    ("bound elsewhere", pod(node="n2"), "expire", True, False),
    ("not bound", pod(node=""), "expire", True, False),
    ("an empty object: not that pod", {}, "expire", True, False),
    ("unavailable", 503, "api_unanswered", False, False),
    ("forbidden", 403, "api_unanswered", False, False),
    ("throttled", 429, "api_unanswered", False, False),
    ("no answer (a timeout, the connection lost)", None, "api_unanswered", False, True),
]


@pytest.mark.parametrize(("answer", "verdict", "ends", "holds"), [a[1:] for a in AFTER], ids=[a[0] for a in AFTER])
def test_after_read(answer: Answer, verdict: Verdict, ends: bool, holds: bool) -> None:
    assert after_read("u1", "n1", answer) == verdict
    assert answered(answer) is ends
    assert holds_reads(answer) is holds
    assert (verdict in KEPT) is (verdict != "expire")


@pytest.mark.parametrize(("took", "rest"), [(0.0, 5.0), (1.5, 3.5), (5.0, 0.0), (12.0, 0.0)])
def test_sweeps_start_the_interval_apart_from_each_ones_start(took: float, rest: float) -> None:
    assert janitor_rest_s(took) == rest


SWEEPS: list[tuple[int, float, float]] = [
    # reads, seconds per read -> the reads' time of a sweep
    (0, 4.0, 0.0),
    (1, 1.0, 1.0),
    (API_HOLDS_READS, 4.0, 4.0),  # a burst up to the limit: one read's time
    (API_HOLDS_READS + 1, 4.0, 8.0),
    (100, 1.0, 13.0),
    (3, 60.0, API_HOLDS_READ_S),  # a read is waited for API_HOLDS_READ_S at most
]


@pytest.mark.parametrize(("reads", "read_s", "took"), SWEEPS)
def test_a_sweeps_reads_take_a_read_per_turn(reads: int, read_s: float, took: float) -> None:
    assert janitor_sweep_s(reads, read_s) == took


BOUNDS: list[tuple[str, float, float, float]] = [
    # what: pendingTTLSeconds, the longest sweep -> the latest release, counted from the booking
    ("the default TTL, sweeps of no time: the TTL and one sweep's interval", 120, 0.0, 125.0),
    ("the default TTL, a slow API server: the interval and one sweep more", 120, 4.0, 129.0),
    ("a TTL no multiple of the interval: rounded up to a sweep's start", 7, 0.0, 15.0),
    ("the least TTL", 5, 1.0, 11.0),
    ("sweeps longer than the interval follow one another at once", 120, 13.0, 159.0),
]


@pytest.mark.parametrize(("ttl", "sweep", "bound"), [b[1:] for b in BOUNDS], ids=[b[0] for b in BOUNDS])
def test_the_release_bound(ttl: float, sweep: float, bound: float) -> None:
    assert JANITOR_INTERVAL_S == 5.0
    assert pending_release_bound_s(ttl, sweep) == bound


def test_the_read_limit_is_small_and_the_watcher_uses_it() -> None:
    from controller import pod_watch
    assert 1 < API_HOLDS_READS <= 8  # overlapping, without flooding the API server (shared/domain/timing.py)
    assert pod_watch.API_HOLDS_READS == API_HOLDS_READS and pod_watch.API_HOLDS_READ_S == API_HOLDS_READ_S
