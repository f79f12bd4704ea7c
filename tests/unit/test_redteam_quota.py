"""Red team: quota charges as the API server's quota evaluator makes them (QuotaV1Pod). A pod stuck
terminating past its grace period (its node was lost) is no longer charged by the API server, so that
the namespace can start its replacements; the webhook charged it until the pod object was gone, refusing
the replacement of the pod on a lost node under a `limits.`/bare quota the namespace fits."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from shared.domain.admission import decide
from shared.domain.quota import in_scope, judge_quotas
from tests.unit.test_quota import CFG, MEM, PODS, QUOTAS, Api, hq, pod, quota, slice_
from webhook.quotas import QuotaReader

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC).timestamp()


def deleting(name: str, at: str, grace: int | None) -> dict[str, Any]:
    p = pod(name, slice_(64), phase="Running")
    p["metadata"]["deletionTimestamp"] = at
    if grace is not None:
        p["metadata"]["deletionGracePeriodSeconds"] = grace
    return p


LIMIT = [hq("gpu", **{f"limits.{MEM}": "96"})]


def test_a_pod_stuck_terminating_past_its_grace_is_not_charged() -> None:
    stuck = deleting("lost", "2026-12-01T11:00:00Z", 30)  # an hour past its 30 s
    assert judge_quotas(pod("new", slice_(64)), {MEM: 64}, LIMIT, [stuck], CFG, now=NOW) is None


def test_a_pod_within_its_grace_is_still_charged() -> None:
    leaving = deleting("leaving", "2026-12-01T11:59:50Z", 30)  # 10 s into its 30 s
    assert judge_quotas(pod("new", slice_(64)), {MEM: 64}, LIMIT, [leaving], CFG, now=NOW) is not None
    no_grace = deleting("odd", "2026-12-01T11:00:00Z", None)  # the API server charges it (no grace recorded)
    assert judge_quotas(pod("new", slice_(64)), {MEM: 64}, LIMIT, [no_grace], CFG, now=NOW) is not None
    garbled = deleting("odd", "yesterday", 30)  # unreadable: charged (fail closed)
    assert judge_quotas(pod("new", slice_(64)), {MEM: 64}, LIMIT, [garbled], CFG, now=NOW) is not None


def test_the_webhook_reads_the_clock_for_it() -> None:
    api = Api({QUOTAS: {"items": LIMIT},
               PODS: {"items": [deleting("lost", "2020-01-01T00:00:00Z", 30)]}})
    p = pod("new", slice_(64))
    d = asyncio.run(QuotaReader(api, CFG).judge("team", p, decide(p, CFG, {96})))
    assert d.allowed, d.message


# BestEffort as the API server's QoS rule (ComputePodQOS) decides it: only positive cpu/memory amounts count,
# and pod-level resources (spec.resources, on by default since Kubernetes 1.34) decide when present. A pod
# with `spec.resources.limits.cpu` dodged a NotBestEffort quota: the webhook took it for BestEffort.
def test_pod_level_resources_make_a_pod_not_best_effort() -> None:
    p = pod("p", slice_(8), resources={"limits": {"cpu": "1"}, "requests": {"cpu": "1"}})
    assert in_scope(quota("nb", scopes=["NotBestEffort"]), p)
    assert not in_scope(quota("b", scopes=["BestEffort"]), p)


def test_zero_cpu_and_memory_leave_a_pod_best_effort() -> None:
    p = pod("p", {**slice_(8), "cpu": "0", "memory": "0"})
    assert in_scope(quota("b", scopes=["BestEffort"]), p)
    assert not in_scope(quota("nb", scopes=["NotBestEffort"]), p)
