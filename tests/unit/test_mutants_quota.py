"""Quota rules no other test pinned down (red team, mutants).

Each case names the small bug it guards against: with the bug in shared/domain/quota.py the case fails.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from shared.domain.quota import in_scope, judge_quotas
from tests.unit.test_quota import CFG, MEM, hq, pod, quota, slice_

LIMIT = [hq("gpu", **{f"limits.{MEM}": "96"})]
DELETED = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC).timestamp()


def deleting(grace: int) -> dict[str, Any]:
    p = pod("leaving", slice_(64), phase="Running")
    p["metadata"]["deletionTimestamp"] = "2026-12-01T12:00:00Z"
    p["metadata"]["deletionGracePeriodSeconds"] = grace
    return p


# mutant: "stuck terminating" from the instant its grace ends (>=); the API server's QuotaV1Pod stops charging a
# pod only once now is *after* deletion + grace (now.After)
@pytest.mark.parametrize(("seconds_after", "charged"), [(29, True), (30, True), (31, False)])
def test_a_pod_is_charged_until_its_grace_period_has_passed(seconds_after: int, charged: bool) -> None:
    refusal = judge_quotas(pod("new", slice_(64)), {MEM: 64}, LIMIT, [deleting(30)], CFG,
                           now=DELETED + seconds_after)
    assert (refusal is not None) is charged


# mutant: only cpu counts against BestEffort (a pod with a memory request or limit alone is Burstable)
@pytest.mark.parametrize(("part", "best_effort"), [
    ({"limits": {"memory": "1Gi"}}, False),
    ({"requests": {"memory": "64Mi"}}, False),
    ({"requests": {"cpu": "100m"}}, False),
    ({"requests": {"memory": "0"}}, True),  # only positive amounts count
    ({}, True),
])
def test_a_memory_amount_alone_makes_a_pod_not_best_effort(part: dict[str, Any], best_effort: bool) -> None:
    p = pod("p", slice_(8))
    for key, amounts in part.items():
        p["spec"]["containers"][0]["resources"].setdefault(key, {}).update(amounts)
    assert in_scope(quota("b", scopes=["BestEffort"]), p) is best_effort
    assert in_scope(quota("b", scopes=["NotBestEffort"]), p) is not best_effort


# mutant: a quota's scopes ORed instead of ANDed (the API server selects a pod only when every scope matches)
def test_every_scope_of_a_quota_must_select_the_pod() -> None:
    both = quota("q", scopes=["Terminating", "BestEffort"])
    assert in_scope(both, pod("p", slice_(8), activeDeadlineSeconds=60)) is True
    assert in_scope(both, pod("p", slice_(8))) is False  # BestEffort, not Terminating
    assert in_scope(both, pod("p", {**slice_(8), "cpu": "1"}, activeDeadlineSeconds=60)) is False
    mixed = quota("m", scopes=["NotTerminating"],
                  selector=[{"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}])
    assert in_scope(mixed, pod("p", priorityClassName="high")) is True
    assert in_scope(mixed, pod("p", priorityClassName="low")) is False
    assert in_scope(mixed, pod("p", priorityClassName="high", activeDeadlineSeconds=5)) is False


# mutant: pod-level resources decide only when not empty; the API server's ComputePodQOS (pkg/apis/core/helper/qos,
# pinned v1.36.3) reads them whenever spec.resources is set (`pod.Spec.Resources != nil`), even empty
def test_pod_level_resources_decide_best_effort_even_when_empty() -> None:
    p = pod("p", {**slice_(8), "cpu": "1"})
    assert in_scope(quota("b", scopes=["NotBestEffort"]), p) is True
    p["spec"]["resources"] = {}
    assert in_scope(quota("b", scopes=["BestEffort"]), p) is True
    p["spec"]["resources"] = {"requests": {"memory": "1Gi"}}
    assert in_scope(quota("b", scopes=["BestEffort"]), p) is False


# mutants: a deletion time without a zone, or a grace period that is a boolean (true == 1 in Python), read as a
# pod stuck terminating: a stamp that cannot be read for sure is charged (fail closed), as a garbled one is
@pytest.mark.parametrize(("at", "grace"), [("2026-12-01T12:00:00", 30), ("2026-12-01T12:00:00Z", True)])
def test_a_deletion_stamp_that_cannot_be_read_for_sure_is_charged(at: str, grace: object) -> None:
    p = pod("leaving", slice_(64), phase="Running")
    p["metadata"]["deletionTimestamp"] = at
    p["metadata"]["deletionGracePeriodSeconds"] = grace
    an_hour_later = DELETED + 3600
    assert judge_quotas(pod("new", slice_(64)), {MEM: 64}, LIMIT, [p], CFG, now=an_hour_later) is not None
    p["metadata"]["deletionTimestamp"], p["metadata"]["deletionGracePeriodSeconds"] = "2026-12-01T12:00:00Z", 30
    assert judge_quotas(pod("new", slice_(64)), {MEM: 64}, LIMIT, [p], CFG, now=an_hour_later) is None


# mutant: what is left is hard - used unclamped: a quota lowered below what its pods already hold said "left: -32"
def test_a_quota_already_exceeded_says_nothing_is_left() -> None:
    lowered = [hq("gpu", **{f"limits.{MEM}": "32"})]
    held = [pod("big", slice_(64), phase="Running")]
    assert judge_quotas(pod("new", slice_(8)), {MEM: 8}, lowered, held, CFG) == (
        f"exceeded quota: gpu, requested: limits.{MEM}=8, left: limits.{MEM}=0 (used 64 by 1 pod, limited 32)")
