"""Metrics added for the dashboard and alerts: filter failures by bounded HAMi reason, readiness and
Redis reachability read at scrape time."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from shared.domain.fit import Reasons, failure_names
from shared.serving.metrics import READY, REDIS_UP, count_filter_failures, failure_label
from shared.serving.supervise import Heartbeat


@pytest.mark.parametrize(("why", "names"), [
    (Reasons.of({"CardInsufficientMemory": 2}, 2), ("CardInsufficientMemory",)),
    (Reasons.of({"CardUuidMismatch": 1, "CardInsufficientMemory": 1}, 2),
     ("CardInsufficientMemory", "CardUuidMismatch")),
    (Reasons.of({"NodeInsufficientDevice": 1}, 1), ("NodeInsufficientDevice",)),
    ("node unregistered: no cards", ("node unregistered: no cards",)),  # a node-level reason is one name
])
def test_failure_names(why: Reasons | str, names: tuple[str, ...]) -> None:
    assert failure_names(why) == names


@pytest.mark.parametrize(("name", "label"), [
    ("CardInsufficientCore", "CardInsufficientCore"),
    ("AllocatedCardsInsufficientRequest", "AllocatedCardsInsufficientRequest"),
    ("node unregistered", "NodeUnregistered"),
    ("node unregistered: quarantined: ns/pod bound here", "NodeUnregistered"),  # free text never becomes a label
    ("container \"c\": mthreads.com/sgpu-memory=3", "Other"),
    ("X" * 65, "Other"),
    ("", "Other"),
])
def test_failure_label_is_bounded(name: str, label: str) -> None:
    assert failure_label(name) == label


def _failures(reason: str) -> float:
    return REGISTRY.get_sample_value("mtsched_filter_failures_total", {"reason": reason}) or 0.0


def test_count_filter_failures_once_per_reason_per_call() -> None:
    before = {r: _failures(r) for r in ("CardInsufficientMemory", "CardNotHealth", "NodeUnregistered")}
    count_filter_failures({"n1": Reasons.of({"CardInsufficientMemory": 2}, 2),
                           "n2": Reasons.of({"CardInsufficientMemory": 1, "CardNotHealth": 1}, 2)},
                          {"n3": "node unregistered: no such node"})
    assert _failures("CardInsufficientMemory") - before["CardInsufficientMemory"] == 1  # two nodes, one call
    assert _failures("CardNotHealth") - before["CardNotHealth"] == 1
    assert _failures("NodeUnregistered") - before["NodeUnregistered"] == 1
    count_filter_failures({}, {})
    assert _failures("CardInsufficientMemory") - before["CardInsufficientMemory"] == 1


def test_gauges_follow_their_condition_at_scrape_time() -> None:
    why: list[str] = ["redis: not confirmed"]
    READY.set_function(lambda: 0.0 if why else 1.0)
    assert REGISTRY.get_sample_value("mtsched_ready") == 0.0
    why.clear()
    assert REGISTRY.get_sample_value("mtsched_ready") == 1.0
    beat = Heartbeat("Redis", max_age=60.0)
    REDIS_UP.set_function(lambda: 0.0 if beat() else 1.0)
    assert REGISTRY.get_sample_value("mtsched_redis_up") == 0.0  # never answered yet
    beat.ok()
    assert REGISTRY.get_sample_value("mtsched_redis_up") == 1.0
