"""Node constraints and bind admissibility (shared/domain/placement.py), by tables."""

from __future__ import annotations

from typing import Any

import pytest

from shared.domain.placement import BindCandidate, NodeRequirement, bind_refusal, node_requirement
from shared.domain.shapes import ShapeError

REQ = "requiredDuringSchedulingIgnoredDuringExecution"


def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"affinity": {"nodeAffinity": {REQ: {"nodeSelectorTerms": list(terms)}}}}


def expr(key: str, op: str, *values: str) -> dict[str, Any]:
    e: dict[str, Any] = {"key": key, "operator": op}
    if values:
        e["values"] = list(values)
    return e


def req(**spec: Any) -> NodeRequirement:
    return node_requirement({"spec": spec})


GPU = {"pool": "gpu", "zone": "a", "cards": "8"}


@pytest.mark.parametrize(("spec", "labels", "node", "ok"), [
    ({}, {}, "n1", True),
    ({"nodeSelector": {"pool": "gpu"}}, GPU, "n1", True),
    ({"nodeSelector": {"pool": "gpu", "zone": "b"}}, GPU, "n1", False),
    ({"nodeSelector": {"pool": "gpu"}}, {}, "n1", False),
    (affinity({"matchExpressions": [expr("pool", "In", "gpu", "cpu")]}), GPU, "n1", True),
    (affinity({"matchExpressions": [expr("pool", "In", "cpu")]}), GPU, "n1", False),
    (affinity({"matchExpressions": [expr("pool", "In", "gpu")]}), {}, "n1", False),
    (affinity({"matchExpressions": [expr("pool", "NotIn", "cpu")]}), GPU, "n1", True),
    (affinity({"matchExpressions": [expr("pool", "NotIn", "gpu")]}), GPU, "n1", False),
    (affinity({"matchExpressions": [expr("pool", "NotIn", "gpu")]}), {}, "n1", True),  # absent: not in
    (affinity({"matchExpressions": [expr("zone", "Exists")]}), GPU, "n1", True),
    (affinity({"matchExpressions": [expr("rack", "Exists")]}), GPU, "n1", False),
    (affinity({"matchExpressions": [expr("rack", "DoesNotExist")]}), GPU, "n1", True),
    (affinity({"matchExpressions": [expr("zone", "DoesNotExist")]}), GPU, "n1", False),
    (affinity({"matchExpressions": [expr("cards", "Gt", "4")]}), GPU, "n1", True),
    (affinity({"matchExpressions": [expr("cards", "Gt", "8")]}), GPU, "n1", False),
    (affinity({"matchExpressions": [expr("cards", "Lt", "9")]}), GPU, "n1", True),
    (affinity({"matchExpressions": [expr("cards", "Lt", "9223372036854775807")]}), GPU, "n1", True),  # int64 max
    (affinity({"matchExpressions": [expr("cards", "Gt", "-9223372036854775808")]}), GPU, "n1", True),  # int64 min
    (affinity({"matchExpressions": [expr("zone", "Gt", "1")]}), GPU, "n1", False),  # "a" is no number
    # expressions of a term are ANDed
    (affinity({"matchExpressions": [expr("pool", "In", "gpu"), expr("zone", "In", "b")]}), GPU, "n1", False),
    # terms are ORed
    (affinity({"matchExpressions": [expr("zone", "In", "b")]}, {"matchExpressions": [expr("pool", "Exists")]}),
     GPU, "n1", True),
    # an empty term matches nothing, as do no terms at all
    (affinity({}), GPU, "n1", False),
    (affinity(), GPU, "n1", False),
    (affinity({"matchFields": [expr("metadata.name", "In", "n1", "n2")]}), {}, "n1", True),
    (affinity({"matchFields": [expr("metadata.name", "NotIn", "n1")]}), {}, "n1", False),
    # nodeSelector and affinity must both hold
    ({"nodeSelector": {"pool": "gpu"}, **affinity({"matchExpressions": [expr("zone", "In", "b")]})},
     GPU, "n1", False),
    # preferred terms do not constrain
    ({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1}]}}},
     {}, "n1", True),
])
def test_node_requirement_matches_like_kubernetes(spec: dict[str, Any], labels: dict[str, str], node: str,
                                                  ok: bool) -> None:
    assert (req(**spec).refusal(node, labels) == "") is ok


def test_refusal_names_the_label() -> None:
    assert req(nodeSelector={"pool": "gpu"}).refusal("n1", {"pool": "cpu"}) == (
        "it does not match the pod's nodeSelector pool='gpu' (the node has pool='cpu')")
    assert "no label pool" in req(nodeSelector={"pool": "gpu"}).refusal("n1", {})
    assert "none of the pod's 1 required node affinity terms" in req(
        **affinity({"matchExpressions": [expr("pool", "In", "x")]})).refusal("n1", {})


@pytest.mark.parametrize(("spec", "field"), [
    ({"nodeSelector": []}, "spec.nodeSelector"),
    ({"nodeSelector": {"a": 1}}, 'spec.nodeSelector["a"]'),
    ({"affinity": 5}, "spec.affinity"),
    ({"affinity": {"nodeAffinity": []}}, "spec.affinity.nodeAffinity"),
    ({"affinity": {"nodeAffinity": {REQ: 5}}}, f"spec.affinity.nodeAffinity.{REQ}"),
    ({"affinity": {"nodeAffinity": {REQ: {"nodeSelectorTerms": {}}}}},
     f"spec.affinity.nodeAffinity.{REQ}.nodeSelectorTerms"),
    (affinity(5), f"spec.affinity.nodeAffinity.{REQ}.nodeSelectorTerms[0]"),  # type: ignore[arg-type]
    (affinity({"matchExpressions": [5]}), f"spec.affinity.nodeAffinity.{REQ}.nodeSelectorTerms[0].matchExpressions[0]"),
    (affinity({"matchExpressions": [expr("a", "Like", "x")]}),
     f"spec.affinity.nodeAffinity.{REQ}.nodeSelectorTerms[0].matchExpressions[0].operator"),
    (affinity({"matchExpressions": [expr("", "Exists")]}),
     f"spec.affinity.nodeAffinity.{REQ}.nodeSelectorTerms[0].matchExpressions[0].key"),
    (affinity({"matchExpressions": [expr("a", "In")]}),
     f"spec.affinity.nodeAffinity.{REQ}.nodeSelectorTerms[0].matchExpressions[0].values"),
    (affinity({"matchExpressions": [expr("a", "Exists", "x")]}),
     f"spec.affinity.nodeAffinity.{REQ}.nodeSelectorTerms[0].matchExpressions[0].values"),
    (affinity({"matchExpressions": [expr("a", "Gt", "x")]}),
     f"spec.affinity.nodeAffinity.{REQ}.nodeSelectorTerms[0].matchExpressions[0].values"),
    # beyond int64, or with blanks: Go's strconv.ParseInt refuses both, so Kubernetes has no such requirement
    (affinity({"matchExpressions": [expr("a", "Gt", "9223372036854775808")]}),
     f"spec.affinity.nodeAffinity.{REQ}.nodeSelectorTerms[0].matchExpressions[0].values"),
    (affinity({"matchExpressions": [expr("a", "Lt", " 4")]}),
     f"spec.affinity.nodeAffinity.{REQ}.nodeSelectorTerms[0].matchExpressions[0].values"),
    (affinity({"matchExpressions": [{"key": "a", "operator": "In", "values": [1]}]}),
     f"spec.affinity.nodeAffinity.{REQ}.nodeSelectorTerms[0].matchExpressions[0].values[0]"),
    (affinity({"matchFields": [expr("metadata.labels", "In", "x")]}),
     f"spec.affinity.nodeAffinity.{REQ}.nodeSelectorTerms[0].matchFields[0].key"),
    (affinity({"matchFields": [expr("metadata.name", "Exists")]}),
     f"spec.affinity.nodeAffinity.{REQ}.nodeSelectorTerms[0].matchFields[0].operator"),
])
def test_malformed_constraints_name_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(ShapeError) as e:
        req(**spec)
    assert e.value.field == field and str(e.value).startswith(f"{field}: got ")


def cand(asks: bool = True, scheduler: str = "hami-scheduler", **spec: Any) -> BindCandidate:
    return BindCandidate("ns", "p", asks, scheduler, req(**spec))


R = "mthreads.com/vgpu"


@pytest.mark.parametrize(("candidate", "node", "labels", "needle"), [
    (cand(), "n1", None, ""),  # no constraint: labels are not needed
    (cand(nodeSelector={"pool": "gpu"}), "n1", {"pool": "gpu"}, ""),
    (cand(asks=False), "n1", {}, "bind: pod ns/p asks for no mthreads.com/vgpu"),
    (cand(scheduler="default-scheduler"), "n1", {}, 'schedulerName "default-scheduler" is not "hami-scheduler"'),
    (cand(scheduler=""), "n1", {}, 'schedulerName "default-scheduler" is not'),  # the API's default
    (cand(scheduler="volcano"), "n1", {}, 'schedulerName "volcano"'),
    (cand(), "N1", {}, "bind: node 'N1' is not a node name"),
    (cand(nodeSelector={"pool": "gpu"}), "n1", None, "could not be read"),  # fail closed
    (cand(nodeSelector={"pool": "gpu"}), "n1", {"pool": "cpu"}, "bind: pod ns/p cannot go to node n1: it does not"),
    (cand(**affinity({"matchExpressions": [expr("pool", "In", "gpu")]})), "n1", {}, "cannot go to node n1"),
])
def test_bind_refusal(candidate: BindCandidate, node: str, labels: dict[str, str] | None, needle: str) -> None:
    why = bind_refusal(candidate, node, labels, "hami-scheduler", R)
    assert (why == "") if not needle else (needle in why), why
