"""The webhook keeps a quota view of each live pod (shared/domain/quota.py quota_view), not the pod: the rule must
decide alike on both. Every quota scope, every way a pod holds or stops holding units, and pods that hold none."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from shared.domain.quota import QuotaError, judge_quotas, quota_view
from tests.unit.test_quota import CFG, CORE, MEM, VGPU, asked, pod, quota, slice_

BIG = {"annotations": {"x": "y" * 50_000}, "labels": {"app": "a"}, "managedFields": [{"manager": "m" * 1000}]}


def heavy(p: dict[str, Any], **meta: Any) -> dict[str, Any]:
    """The pod as the API server lists it: annotations, managed fields, env, volumes, status."""
    p["metadata"] = {**p["metadata"], **BIG, "namespace": "team", "uid": f"uid-{p['metadata']['name']}", **meta}
    for c in p["spec"].get("containers", []):
        c["env"] = [{"name": f"E{i}", "value": "v" * 100} for i in range(20)]
        c["image"] = "registry/img:tag"
    p["spec"]["volumes"] = [{"name": "v", "emptyDir": {}}]
    p.setdefault("status", {}).update(conditions=[{"type": "Ready", "status": "True"}], podIP="10.0.0.1")
    return p


PODS = [
    heavy(pod("running", slice_(32), phase="Running")),
    heavy(pod("pending", slice_(16, 2))),
    heavy(pod("cpu", {"cpu": "1"}, phase="Running")),  # names none of ours: no view at all
    heavy(pod("done", slice_(32), phase="Succeeded")),
    heavy(pod("whole", {VGPU: "1"}, phase="Running")),
    heavy(pod("high", slice_(8), phase="Running", priorityClassName="high")),
    heavy(pod("deadline", slice_(8), phase="Running", activeDeadlineSeconds=60)),
    heavy(pod("besteffort-ish", {MEM: "8", CORE: "1"}, phase="Running")),
    heavy(pod("sidecar", slice_(4), phase="Running", initContainers=[
        {"name": "side", "restartPolicy": "Always", "resources": {"limits": dict(slice_(8))}}])),
    heavy(pod("init", slice_(4), init=slice_(16), phase="Running")),
    heavy(pod("cross", slice_(8), phase="Running", affinity={"podAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "k", "namespaces": ["other"]}]}})),
    heavy(pod("stuck", slice_(16), phase="Running"), deletionTimestamp="2026-01-01T00:00:00Z",
          deletionGracePeriodSeconds=30),
    heavy(pod("leaving", slice_(16), phase="Running"), deletionTimestamp="2099-01-01T00:00:00Z",
          deletionGracePeriodSeconds=30),
    heavy(pod("pod-level", slice_(8), phase="Running", resources={"limits": {"cpu": "1"}})),
]

def q(name: str, key: str, value: str, **scoping: Any) -> dict[str, Any]:
    out = quota(name, **scoping)
    out["spec"]["hard"] = {key: value}
    return out


QUOTAS = [
    q("all", f"limits.{MEM}", "200"),
    q("cores", f"limits.{CORE}", "13"),
    q("count", VGPU, "12"),
    q("term", f"limits.{MEM}", "40", scopes=["Terminating"]),
    q("notterm", MEM, "150", scopes=["NotTerminating"]),
    q("be", f"limits.{MEM}", "150", scopes=["BestEffort"]),
    q("notbe", f"limits.{MEM}", "20", scopes=["NotBestEffort"]),
    q("prio", f"limits.{MEM}", "10", selector=[{"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]),
    q("cross", f"limits.{MEM}", "9", scopes=["CrossNamespacePodAffinity"]),
]

CROSS = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
    {"weight": 1, "podAffinityTerm": {"topologyKey": "k", "namespaceSelector": {}}}]}}
NEW = [pod("n1", slice_(32)), pod("n2", slice_(8), priorityClassName="high"), pod("n3", {VGPU: "1"}),
       pod("n4", slice_(4), activeDeadlineSeconds=10), pod("n5", {VGPU: "2"}),
       pod("n6", slice_(64), activeDeadlineSeconds=10), pod("n7", slice_(8), affinity=CROSS),
       pod("n8", {**slice_(16), "cpu": "1"})]


def decision(new: dict[str, Any], pods: list[dict[str, Any]], quotas: list[dict[str, Any]]) -> str | None:
    try:
        return judge_quotas(new, asked(new), quotas, pods, CFG, now=1.9e9)
    except QuotaError as e:
        return f"error: {e}"


@pytest.mark.parametrize(("new", "quotas"), [(n, [q]) for n, q in itertools.product(NEW, QUOTAS)]
                         + [(n, QUOTAS) for n in NEW])
def test_the_rule_decides_alike_on_pods_and_on_their_views(new: dict[str, Any], quotas: list[dict[str, Any]]) -> None:
    views = [v for p in PODS if (v := quota_view(p, CFG)) is not None]
    assert decision(new, views, quotas) == decision(new, PODS, quotas)


def test_the_views_are_small_and_skip_pods_without_our_resources() -> None:
    views = {p["metadata"]["name"]: quota_view(p, CFG) for p in PODS}
    assert views["cpu"] is None
    assert all(len(repr(v)) < 1500 for v in views.values() if v is not None)
    assert all(len(repr(p)) > 50_000 for p in PODS)


def test_every_quota_refuses_some_pod_and_admits_another_so_the_table_means_something() -> None:
    for one in QUOTAS:
        assert {decision(n, PODS, [one]) is None for n in NEW} == {True, False}, one["metadata"]["name"]


def test_a_malformed_pod_of_ours_still_refuses() -> None:
    bad = heavy(pod("bad", {VGPU: "1", MEM: "lots"}, phase="Running"))
    view = quota_view(bad, CFG)
    assert view is not None
    assert decision(NEW[0], [view], [QUOTAS[0]]) == decision(NEW[0], [bad], [QUOTAS[0]])
    assert (decision(NEW[0], [view], [QUOTAS[0]]) or "").startswith("error: ")
