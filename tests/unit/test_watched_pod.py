"""The watchers keep a view of each pod (controller/pod_watch.py watched_pod), not the pod: every rule they apply to a
pod must answer alike on both, and the view must stay small whatever the pod carries (a re-list holds every pod)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from controller.pod_watch import pod_ref, tried, unaccounted, watched_pod
from shared.config import load_config
from shared.domain.annotations import CardGrant, binding_annotations, usage_from_annotations
from shared.domain.quota import is_terminal
from shared.domain.trust import asks_slices, foreign_record

CFG = load_config(env={}, flags={"memoryPerCard": "96,160"})
SLICE = {"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "32", "mthreads.com/sgpu-core": "4"}
RECORD = binding_annotations("n1", [[CardGrant("n1-mthreads-2", 32 * 512 * 1024 * 1024, 4)]], 1_700_000_000 * 10**9)


def pod(name: str, limits: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
        node: str = "n1", **spec: Any) -> dict[str, Any]:
    """A pod as the API server lists it: managed fields, labels, big annotations, env, volumes, status."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}", "resourceVersion": "42",
                     "labels": {"app": name}, "managedFields": [{"manager": "m" * 2000}],
                     "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "x" * 60_000,
                                     **(annotations or {})}},
        "spec": {"nodeName": node, "schedulerName": "hami-scheduler", "volumes": [{"name": "v", "emptyDir": {}}],
                 "containers": [{"name": "c", "image": "img", "env": [{"name": f"E{i}", "value": "v" * 200}
                                                                      for i in range(50)],
                                 "resources": {"limits": dict(limits if limits is not None else SLICE)}}],
                 **spec},
        "status": {"phase": "Running", "podIP": "10.0.0.1",
                   "conditions": [{"type": "Ready", "status": "True"},
                                  {"type": "PodScheduled", "status": "True", "reason": "", "message": "m" * 500}],
                   "containerStatuses": [{"name": "c", "state": {"running": {}}, "image": "img"}]},
    }


PODS = {
    "recorded": pod("recorded", annotations=RECORD),
    "unrecorded": pod("unrecorded"),
    "pinned": pod("pinned", annotations={"mthreads.ai/use-gpuuuid": "n1-mthreads-1", "mtsched.io/card-memory": "96"}),
    "bad pin": pod("bad-pin", annotations={"mtsched.io/card-memory": "lots"}),
    "cpu": pod("cpu", limits={"cpu": "1"}),
    "cpu with record": pod("cpu-rec", limits={"cpu": "1"}, annotations=RECORD),
    "whole": pod("whole", limits={"mthreads.com/vgpu": "1"}),
    "sidecar": pod("sidecar", initContainers=[{"name": "s", "restartPolicy": "Always",
                                               "resources": {"limits": dict(SLICE)}}]),
    "unbound": pod("unbound", node=""),
    "gated": pod("gated", node="", schedulingGates=[{"name": "g"}]),
    "other scheduler": pod("other", schedulerName="default-scheduler", annotations=RECORD),
    "terminating": {**pod("term"), "metadata": {**pod("term")["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z",
                                                 "deletionGracePeriodSeconds": 30}},
    "succeeded": {**pod("done"), "status": {"phase": "Succeeded"}},
    "bad record": pod("bad-record", annotations={**RECORD, "hami.io/mthreads-vgpu-devices-allocated": "garbage"}),
}


@pytest.mark.parametrize("name", list(PODS))
def test_every_rule_answers_alike_on_the_pod_and_its_view(name: str) -> None:
    full = PODS[name]
    view = watched_pod(copy.deepcopy(full))

    def answers(p: dict[str, Any]) -> tuple[Any, ...]:
        try:
            usage: Any = usage_from_annotations(p)
        except Exception as e:  # an undecodable record: the same error either way
            usage = f"{type(e).__name__}: {e}"
        return (usage, unaccounted(p, CFG), foreign_record(p, CFG), asks_slices(p, CFG), tried(p), is_terminal(p),
                pod_ref(p), (p.get("spec") or {}).get("nodeName"), (p.get("spec") or {}).get("schedulerName"),
                (p.get("spec") or {}).get("schedulingGates"), p["metadata"].get("deletionTimestamp"),
                p["metadata"]["resourceVersion"], p["metadata"]["uid"])

    assert answers(view) == answers(full)
    assert len(repr(view)) < 2_000 < 60_000 < len(repr(full))


def test_only_our_annotations_and_the_scheduling_condition_are_kept() -> None:
    view = watched_pod(PODS["pinned"])
    assert set(view["metadata"]["annotations"]) == {"mthreads.ai/use-gpuuuid", "mtsched.io/card-memory"}
    assert view["status"]["conditions"] == [{"type": "PodScheduled", "reason": ""}]
    assert view["spec"]["containers"] == [{"name": "c", "resources": {"limits": SLICE}}]


@pytest.mark.parametrize("odd", [None, "text", [], {"metadata": "x", "spec": [], "status": 3},
                                 {"metadata": {"annotations": ["a"]}, "spec": {"containers": "c"}}])
def test_odd_objects_pass_without_raising(odd: Any) -> None:
    watched_pod(odd)


def test_a_node_is_kept_without_its_images_and_field_owners() -> None:
    from controller.reflector import slim

    node = {"metadata": {"name": "n", "labels": {"a": "b"}, "annotations": {"mtsched.io/card-knobs": "{}"},
                         "managedFields": [{"manager": "kubelet"}]},
            "status": {"capacity": {"mthreads.com/vgpu": "8"}, "allocatable": {"mthreads.com/vgpu": "8"},
                       "images": [{"names": ["img@sha256:" + "0" * 64], "sizeBytes": 1}] * 100,
                       "volumesAttached": [{"name": "v", "devicePath": "/d"}], "conditions": []}}
    kept = slim(copy.deepcopy(node))
    assert kept["metadata"] == {k: v for k, v in node["metadata"].items() if k != "managedFields"}
    assert kept["status"] == {k: v for k, v in node["status"].items() if k not in ("images", "volumesAttached")}
    assert slim("odd") == "odd" and slim({"status": None}) == {"status": None}
