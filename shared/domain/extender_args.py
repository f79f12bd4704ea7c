"""kube-scheduler's extender/v1 arguments, checked strictly (pure).

ExtenderArgs (filter, prioritize): `Pod`, and `NodeNames` (nodeCacheCapable) or `Nodes` (a
NodeList). ExtenderBindingArgs (bind): `PodName`, `PodNamespace`, `PodUID`, `Node`. kube-scheduler
writes Go field names (no JSON tags) and Go reads them case-insensitively; so do we, and two keys
that differ only in case are refused. Bad shapes raise ArgsError, which the extender answers
with HTTP 400 (kube-scheduler counts a non-200 as an extender error).
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from shared.domain.placement import NodeRequirement, node_requirement
from shared.domain.shapes import (
    MAX_NODES,
    MAX_UID_CHARS,
    ShapeError,
    describe,
    first_bad_name,
    is_dns_label,
    is_dns_subdomain,
    is_uid,
    pod_problems,
    problem,
)

INT32 = 2**31  # spec.priority is an int32


class ArgsError(ValueError):
    """str() starts with the field, as every shape problem does."""


@dataclass(frozen=True)
class ExtenderArgs:
    pod: Mapping[str, Any]
    names: tuple[str, ...]
    nodes: tuple[Mapping[str, Any], ...] | None  # Node objects (a caller that is not node-cache-capable)
    requirement: NodeRequirement
    # `names` as a set, made once: checking them against the mirror and picking them out of the standing
    # ranking both need it (two sets of 5,000 names were a third of a filter's time at 5,000 candidates)
    candidates: frozenset[str]

    @property
    def uid(self) -> str:
        return str(self.pod["metadata"]["uid"])


@dataclass(frozen=True)
class BindingArgs:
    name: str
    namespace: str
    uid: str
    node: str


def _fields(doc: object, names: tuple[str, ...], what: str) -> dict[str, Any]:
    """The named fields of a JSON object, matched case-insensitively (as Go decodes them)."""
    if not isinstance(doc, dict):
        raise ArgsError(problem("body", doc, f"an {what} JSON object"))
    wanted = {n.lower(): n for n in names}
    found: dict[str, Any] = {}
    seen: dict[str, str] = {}
    for key, value in doc.items():
        name = wanted.get(key.lower()) if isinstance(key, str) else None
        if name is None:
            continue  # unknown fields are ignored, as Go does
        if name in seen:
            raise ArgsError(f"{name}: given twice (as {describe(seen[name])} and {describe(key)}); "
                            "allowed: one key per field")
        seen[name] = key
        found[name] = value
    return found


def _pod(pod: object) -> Mapping[str, Any]:
    if not isinstance(pod, dict):
        raise ArgsError(problem("Pod", pod, "a Pod object"))
    meta = pod.get("metadata")
    if not isinstance(meta, dict):
        raise ArgsError(problem("Pod.metadata", meta, "an object with uid, name and namespace"))
    if not is_uid(meta.get("uid")):
        raise ArgsError(problem("Pod.metadata.uid", meta.get("uid"),
                                f"a uid of 1..{MAX_UID_CHARS} characters [A-Za-z0-9._-]"))
    if not is_dns_subdomain(meta.get("name")):
        raise ArgsError(problem("Pod.metadata.name", meta.get("name"), "a pod name (DNS-1123 subdomain)"))
    if not is_dns_label(meta.get("namespace")):
        raise ArgsError(problem("Pod.metadata.namespace", meta.get("namespace"),
                                "a namespace name (DNS-1123 label)"))
    problems = pod_problems(pod, "Pod.")
    if problems:
        raise ArgsError("; ".join(problems))
    # read by the verbs beyond pod_problems: the preemption's node (filter holds the pod's cards there) and the
    # priority (the pods nominated ahead of it)
    status = pod.get("status")
    if status is not None and not isinstance(status, dict):
        raise ArgsError(problem("Pod.status", status, "an object"))
    nominated = (status or {}).get("nominatedNodeName")
    if nominated not in (None, "") and not is_dns_subdomain(nominated):
        raise ArgsError(problem("Pod.status.nominatedNodeName", nominated, "a node name (DNS-1123 subdomain), or none"))
    priority = (pod.get("spec") or {}).get("priority")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)
                                 or not -INT32 <= priority < INT32):
        raise ArgsError(problem("Pod.spec.priority", priority, "a 32-bit integer"))
    return pod


def _names(value: object, field: str, known: AbstractSet[str]) -> tuple[tuple[str, ...], frozenset[str]]:
    if not isinstance(value, list):
        raise ArgsError(problem(field, value, f"a list of at most {MAX_NODES} node names"))
    if len(value) > MAX_NODES:
        raise ArgsError(f"{field}: {len(value)} nodes; allowed: at most {MAX_NODES}")
    try:
        candidates = frozenset(value)
    except TypeError:  # an unhashable element: named below
        candidates = frozenset()
    else:
        if known >= candidates:  # the usual call: every name is a node we know, so a valid name
            return tuple(value), candidates
    bad = first_bad_name(value)
    if bad is not None:
        raise ArgsError(problem(f"{field}[{bad}]", value[bad], "a node name (DNS-1123 subdomain)"))
    return tuple(value), candidates


def _node_list(value: object) -> tuple[tuple[Mapping[str, Any], ...], tuple[str, ...]]:
    if not isinstance(value, dict) or not isinstance(value.get("items"), list):
        raise ArgsError(problem("Nodes", value, "a NodeList object with items"))
    items = value["items"]
    if len(items) > MAX_NODES:
        raise ArgsError(f"Nodes.items: {len(items)} nodes; allowed: at most {MAX_NODES}")
    names = []
    for i, n in enumerate(items):
        meta = n.get("metadata") if isinstance(n, dict) else None
        if not isinstance(meta, dict):
            raise ArgsError(problem(f"Nodes.items[{i}]", n, "a Node object with metadata"))
        if not is_dns_subdomain(meta.get("name")):
            raise ArgsError(problem(f"Nodes.items[{i}].metadata.name", meta.get("name"),
                                    "a node name (DNS-1123 subdomain)"))
        names.append(meta["name"])
    return tuple(items), tuple(names)


def parse_extender_args(doc: object, known_nodes: AbstractSet[str] = frozenset()) -> ExtenderArgs:
    """Filter and prioritize arguments; ArgsError names the first malformed field.

    `known_nodes`: names already known to be node names (the mirror's), which skip the name check.
    """
    f = _fields(doc, ("Pod", "Nodes", "NodeNames"), "ExtenderArgs")
    pod = _pod(f.get("Pod"))
    try:
        requirement = node_requirement(pod, "Pod.")
    except ShapeError as e:
        raise ArgsError(str(e)) from None
    names_raw, nodes_raw = f.get("NodeNames"), f.get("Nodes")
    if names_raw is None and nodes_raw is None:
        raise ArgsError("NodeNames: got null and Nodes: got null; allowed: one of them (candidate nodes)")
    # A caller that is not node-cache-capable sends (and expects back) Node objects.
    if nodes_raw is not None and not names_raw:
        if names_raw is not None:
            _names(names_raw, "NodeNames", known_nodes)  # [] next to Nodes: still checked
        nodes, names = _node_list(nodes_raw)
        return ExtenderArgs(pod, names, nodes, requirement, frozenset(names))
    names, candidates = _names(names_raw, "NodeNames", known_nodes)
    return ExtenderArgs(pod, names, None, requirement, candidates)


def parse_binding_args(doc: object) -> BindingArgs:
    """Bind arguments; ArgsError names the first malformed field."""
    f = _fields(doc, ("PodName", "PodNamespace", "PodUID", "Node"), "ExtenderBindingArgs")
    checks = (
        ("PodName", is_dns_subdomain, "a pod name (DNS-1123 subdomain)"),
        ("PodNamespace", is_dns_label, "a namespace name (DNS-1123 label)"),
        ("PodUID", is_uid, f"a uid of 1..{MAX_UID_CHARS} characters [A-Za-z0-9._-]"),
        ("Node", is_dns_subdomain, "a node name (DNS-1123 subdomain)"),
    )
    for name, ok, allowed in checks:
        if not ok(f.get(name)):
            raise ArgsError(problem(name, f.get(name), allowed))
    return BindingArgs(f["PodName"], f["PodNamespace"], f["PodUID"], f["Node"])
