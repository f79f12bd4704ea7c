"""Red team: quota charges as the API server's quota evaluator makes them (QuotaV1Pod). A pod stuck
terminating past its grace period (its node was lost) is no longer charged by the API server, so that
the namespace can start its replacements; the webhook charged it until the pod object was gone, refusing
the replacement of the pod on a lost node under a `limits.`/bare quota the namespace fits."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from shared.domain.admission import decide
from shared.domain.quota import in_scope, judge_quotas
from shared.kube import ServerClock
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


def dated(api: Api, date: str | None) -> Api:
    """The stand-in API answering with this `Date` header, as a Kube does (shared/kube.py ServerClock)."""
    api.server_clock = ServerClock()  # type: ignore[attr-defined]
    api.server_clock.note(date)  # type: ignore[attr-defined]
    return api


def test_the_webhook_reads_the_api_servers_clock_for_it() -> None:
    api = dated(Api({QUOTAS: {"items": LIMIT}, PODS: {"items": [deleting("lost", "2020-01-01T00:00:00Z", 30)]}}),
                "Tue, 01 Dec 2026 12:00:00 GMT")
    p = pod("new", slice_(64))
    d = asyncio.run(QuotaReader(api, CFG).judge("team", p, decide(p, CFG, {96})))
    assert d.allowed, d.message


def test_a_step_of_the_webhook_hosts_clock_moves_no_charge(monkeypatch: pytest.MonkeyPatch) -> None:
    """Red team (ops): the judgement took the host's wall clock, compared with deletion timestamps the API server
    wrote: an hour ahead, a pod 10 s into its 30-s grace (still running, still charged by the API server) was no
    longer charged and the namespace went past its `limits.` quota (128 of 96 units); behind, pods stuck on a
    lost node stayed charged an hour longer. It takes the API server's clock (its answers' Date) now."""
    p = pod("new", slice_(64))
    for step in (3600.0, -3600.0):
        real = time.time
        monkeypatch.setattr(time, "time", lambda step=step, real=real: real() + step)
        leaving = dated(Api({QUOTAS: {"items": LIMIT}, PODS: {"items": [deleting("leaving", "2026-12-01T11:59:50Z",
                                                                                   30)]}}),
                        "Tue, 01 Dec 2026 12:00:00 GMT")
        d = asyncio.run(QuotaReader(leaving, CFG).judge("team", p, decide(p, CFG, {96})))
        assert not d.allowed and "exceeded quota" in d.message, (step, d)
        lost = dated(Api({QUOTAS: {"items": LIMIT}, PODS: {"items": [deleting("lost", "2026-12-01T11:00:00Z", 30)]}}),
                     "Tue, 01 Dec 2026 12:00:00 GMT")
        d = asyncio.run(QuotaReader(lost, CFG).judge("team", p, decide(p, CFG, {96})))
        assert d.allowed, (step, d.message)
        monkeypatch.undo()
    # no dated answer yet (a stand-in without one): every terminating pod charged, the safe side
    nodate = dated(Api({QUOTAS: {"items": LIMIT}, PODS: {"items": [deleting("lost", "2020-01-01T00:00:00Z", 30)]}}),
                   None)
    assert not asyncio.run(QuotaReader(nodate, CFG).judge("team", p, decide(p, CFG, {96}))).allowed


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
