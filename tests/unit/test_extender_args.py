"""kube-scheduler's extender arguments (shared/domain/extender_args.py), by tables."""

from __future__ import annotations

from typing import Any

import pytest

from shared.domain.extender_args import ArgsError, parse_binding_args, parse_extender_args
from shared.domain.shapes import MAX_NODES


def pod(**meta: Any) -> dict[str, Any]:
    return {"metadata": {"uid": "u1", "name": "p", "namespace": "ns", **meta},
            "spec": {"containers": [{"name": "c"}]}}


def test_node_names_as_kube_scheduler_sends_them() -> None:
    a = parse_extender_args({"Pod": pod(), "Nodes": None, "NodeNames": ["n1", "n2"]})
    assert a.names == ("n1", "n2") and a.nodes is None and a.uid == "u1" and a.requirement.unconstrained
    assert a.candidates == {"n1", "n2"}  # the names as a set, made once for the filter


def test_node_objects_from_a_caller_that_is_not_node_cache_capable() -> None:
    nodes = [{"metadata": {"name": "n1"}}, {"metadata": {"name": "n2", "labels": {"a": "b"}}}]
    a = parse_extender_args({"Pod": pod(), "Nodes": {"items": nodes}, "NodeNames": None})
    assert a.names == ("n1", "n2") and a.nodes == tuple(nodes) and a.candidates == {"n1", "n2"}


def test_field_names_are_matched_case_insensitively_as_go_does() -> None:
    a = parse_extender_args({"pod": pod(), "nodenames": ["n1"], "Unknown": 1})
    assert a.names == ("n1",)
    b = parse_binding_args({"podname": "p", "PODNAMESPACE": "ns", "podUID": "u1", "node": "n1"})
    assert (b.name, b.namespace, b.uid, b.node) == ("p", "ns", "u1", "n1")


def test_nodes_and_names_bounds() -> None:
    assert len(parse_extender_args({"Pod": pod(), "NodeNames": [f"n{i}" for i in range(MAX_NODES)]}).names) == MAX_NODES
    with pytest.raises(ArgsError, match=f"NodeNames: {MAX_NODES + 1} nodes; allowed: at most {MAX_NODES}"):
        parse_extender_args({"Pod": pod(), "NodeNames": ["n"] * (MAX_NODES + 1)})
    with pytest.raises(ArgsError, match=f"Nodes.items: {MAX_NODES + 1} nodes"):
        parse_extender_args({"Pod": pod(), "Nodes": {"items": [{}] * (MAX_NODES + 1)}})


@pytest.mark.parametrize(("doc", "field"), [
    (None, "body"), ([], "body"), ("x", "body"),
    ({"NodeNames": ["n1"]}, "Pod"),
    ({"Pod": [], "NodeNames": ["n1"]}, "Pod"),
    ({"Pod": {"spec": {}}, "NodeNames": ["n1"]}, "Pod.metadata"),
    ({"Pod": pod(uid=None), "NodeNames": ["n1"]}, "Pod.metadata.uid"),
    ({"Pod": pod(uid="a b"), "NodeNames": ["n1"]}, "Pod.metadata.uid"),
    ({"Pod": pod(name="P"), "NodeNames": ["n1"]}, "Pod.metadata.name"),
    ({"Pod": pod(namespace="a.b"), "NodeNames": ["n1"]}, "Pod.metadata.namespace"),
    ({"Pod": pod(annotations={"a": 1}), "NodeNames": ["n1"]}, 'Pod.metadata.annotations["a"]'),
    ({"Pod": {**pod(), "spec": {"containers": [{"resources": []}]}}, "NodeNames": ["n1"]},
     "Pod.spec.containers[0].resources"),
    ({"Pod": {**pod(), "spec": {"nodeSelector": {"a": 1}}}, "NodeNames": ["n1"]}, 'Pod.spec.nodeSelector["a"]'),
    ({"Pod": {**pod(), "spec": {"affinity": []}}, "NodeNames": ["n1"]}, "Pod.spec.affinity"),
    ({"Pod": pod()}, "NodeNames"),
    ({"Pod": pod(), "NodeNames": None, "Nodes": None}, "NodeNames"),
    ({"Pod": pod(), "NodeNames": "n1"}, "NodeNames"),
    ({"Pod": pod(), "NodeNames": {"n1": 1}}, "NodeNames"),
    ({"Pod": pod(), "NodeNames": ["n1", None]}, "NodeNames[1]"),
    ({"Pod": pod(), "NodeNames": ["Node_1"]}, "NodeNames[0]"),
    ({"Pod": pod(), "NodeNames": ["x" * 254]}, "NodeNames[0]"),
    ({"Pod": pod(), "Nodes": []}, "Nodes"),
    ({"Pod": pod(), "Nodes": {"items": None}}, "Nodes"),
    ({"Pod": pod(), "Nodes": {"items": [{"metadata": {}}]}}, "Nodes.items[0].metadata.name"),
    ({"Pod": pod(), "Nodes": {"items": [{"metadata": {"name": "n1"}}]}, "NodeNames": [5]}, "NodeNames[0]"),
    ({"Pod": pod(), "pod": pod(), "NodeNames": ["n1"]}, "Pod"),  # two keys for one field
])
def test_malformed_extender_args(doc: object, field: str) -> None:
    with pytest.raises(ArgsError) as e:
        parse_extender_args(doc)
    assert str(e.value).startswith(f"{field}: "), str(e.value)


@pytest.mark.parametrize(("doc", "field"), [
    ([], "body"),
    ({"PodNamespace": "ns", "PodUID": "u", "Node": "n"}, "PodName"),
    ({"PodName": "p", "PodNamespace": "NS", "PodUID": "u", "Node": "n"}, "PodNamespace"),
    ({"PodName": "p", "PodNamespace": "ns", "PodUID": "", "Node": "n"}, "PodUID"),
    ({"PodName": "p", "PodNamespace": "ns", "PodUID": "u", "Node": 5}, "Node"),
    ({"PodName": "p", "PodNamespace": "ns", "PodUID": "u", "Node": "n", "node": "m"}, "Node"),
])
def test_malformed_binding_args(doc: object, field: str) -> None:
    with pytest.raises(ArgsError) as e:
        parse_binding_args(doc)
    assert str(e.value).startswith(f"{field}: "), str(e.value)


def test_known_node_names_skip_the_name_check_and_others_do_not() -> None:
    known = frozenset({"n1", "n2"})
    assert parse_extender_args({"Pod": pod(), "NodeNames": ["n1", "n2"]}, known).names == ("n1", "n2")
    assert parse_extender_args({"Pod": pod(), "NodeNames": ["n1", "n3"]}, known).names == ("n1", "n3")
    assert parse_extender_args({"Pod": pod(), "NodeNames": ["n1", "n3"]}, known).candidates == {"n1", "n3"}
    for names, index in ((["n1", "BAD"], 1), (["n1", ["n2"]], 1), ([7, "n1"], 0)):
        with pytest.raises(ArgsError, match=rf"^NodeNames\[{index}\]: "):
            parse_extender_args({"Pod": pod(), "NodeNames": names}, known)
