"""A node whose change cannot be written (shared/domain/node_stuck.py): its retry's backoff, its error, its Event."""

from __future__ import annotations

import pytest

from shared.domain.node_stuck import STUCK_REASON, stuck_error, stuck_event, stuck_retry_in


@pytest.mark.parametrize(("attempt", "first", "wait"), [
    (0, 1.0, 1.0), (1, 1.0, 2.0), (4, 1.0, 16.0), (5, 1.0, 30.0), (10_000, 1.0, 30.0), (-1, 1.0, 1.0),
    (2, 0.5, 2.0),
])
def test_retry_backoff(attempt: int, first: float, wait: float) -> None:
    assert stuck_retry_in(attempt, first) == wait


def test_the_error_is_bounded_and_says_closed() -> None:
    e = stuck_error("x" * 10_000)
    assert len(e) < 400 and e.endswith("closed until it can")


def test_the_event_is_named_by_node_uid_and_reason_so_replicas_report_it_once() -> None:
    a = stuck_event("n", "uid-1", "BADINPUT", "hami-scheduler", "2026-01-01T00:00:00Z", "default")
    b = stuck_event("n", "uid-1", "BADINPUT", "hami-scheduler", "2026-01-02T00:00:00Z", "default")
    c = stuck_event("n", "uid-2", "BADINPUT", "hami-scheduler", "2026-01-01T00:00:00Z", "default")
    assert a["metadata"]["name"] == b["metadata"]["name"] != c["metadata"]["name"]
    assert a["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "n", "uid": "uid-1"}
    assert (a["type"], a["reason"]) == ("Warning", STUCK_REASON)
    assert len(stuck_event("n" * 300, "u", "r" * 5000, "c", "t", "default")["message"]) <= 1024
