"""Where a pod may go, and whether our bind may place it: pure checks behind the extender's bind.

kube-scheduler already applies nodeSelector and required node affinity before it calls the
extender; bind checks them again because a bind call names any pod and any node, and a Binding
made with our credentials carries an allocation record the device plugin trusts. Semantics follow
Kubernetes: nodeSelector pairs must all match; required node affinity terms are ORed, the
expressions of a term ANDed, a term with no expressions matches nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shared.domain.shapes import ShapeError, is_dns_subdomain, key_path

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
FIELD_OPERATORS = ("In", "NotIn")  # matchFields: only metadata.name, as in Kubernetes
_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


@dataclass(frozen=True)
class Expr:
    key: str
    op: str
    values: frozenset[str]

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        if self.op == "Exists":
            return value is not None
        if self.op == "DoesNotExist":
            return value is None
        if self.op == "In":
            return value is not None and value in self.values
        if self.op == "NotIn":
            return value is None or value not in self.values
        # Gt / Lt: both sides integers (the one value is checked when parsed)
        number = _int(value)
        bound = _int(next(iter(self.values)))
        if number is None or bound is None:
            return False
        return number > bound if self.op == "Gt" else number < bound


@dataclass(frozen=True)
class Term:
    exprs: tuple[Expr, ...] = ()
    fields: tuple[Expr, ...] = ()  # keyed by "metadata.name"

    def matches(self, node: str, labels: Mapping[str, str]) -> bool:
        if not self.exprs and not self.fields:
            return False
        name = {"metadata.name": node}
        return all(e.matches(labels) for e in self.exprs) and all(f.matches(name) for f in self.fields)


@dataclass(frozen=True)
class NodeRequirement:
    selector: tuple[tuple[str, str], ...] = ()
    terms: tuple[Term, ...] | None = None  # None: the pod has no required node affinity

    @property
    def unconstrained(self) -> bool:
        return not self.selector and self.terms is None

    def size(self) -> int:
        """Approximate bytes held (for the extender's byte-bounded pod cache)."""
        n = sum(len(k) + len(v) + 32 for k, v in self.selector)
        for t in self.terms or ():
            n += 64 + sum(len(e.key) + 48 + sum(len(v) + 40 for v in e.values) for e in (*t.exprs, *t.fields))
        return n

    def refusal(self, node: str, labels: Mapping[str, str]) -> str:
        """Why the node does not suit the pod ("" when it does)."""
        for k, v in self.selector:
            if labels.get(k) != v:
                have = labels.get(k)
                return (f"it does not match the pod's nodeSelector {k}={v!r} (the node has "
                        + (f"{k}={have!r})" if have is not None else f"no label {k})"))
        if self.terms is not None and not any(t.matches(node, labels) for t in self.terms):
            return f"it matches none of the pod's {len(self.terms)} required node affinity terms"
        return ""


def _int(text: str | None) -> int | None:
    """The value as Go's strconv.ParseInt(text, 10, 64) reads it for Gt/Lt (Kubernetes' labels.Requirement): an
    optional sign and ASCII digits, nothing around them, within int64; None where that fails."""
    if text is None:
        return None
    body = text[1:] if text[:1] in "+-" else text
    if not body or len(body) > 19 or not body.isascii() or not body.isdigit():
        return None
    n = int(text)
    return n if -(2**63) <= n < 2**63 else None


def _list(value: object, field: str, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ShapeError(field, value, f"a list of {what}")
    return value


def _expr(raw: object, field: str, fields: bool) -> Expr:
    if not isinstance(raw, dict):
        raise ShapeError(field, raw, "an object with key, operator and values")
    key, op = raw.get("key"), raw.get("operator")
    ops = FIELD_OPERATORS if fields else OPERATORS
    if fields and key != "metadata.name":
        raise ShapeError(f"{field}.key", key, '"metadata.name"')
    if not isinstance(key, str) or not 0 < len(key) <= 317:  # prefix (253) + "/" + name (63)
        raise ShapeError(f"{field}.key", key, "a label key")
    if not isinstance(op, str) or op not in ops:
        raise ShapeError(f"{field}.operator", op, ", ".join(ops))
    values = _list(raw.get("values"), f"{field}.values", "strings")
    for i, v in enumerate(values):
        if not isinstance(v, str):
            raise ShapeError(f"{field}.values[{i}]", v, "a string")
    if op in ("In", "NotIn") and not values:
        raise ShapeError(f"{field}.values", raw.get("values"), f"at least one value for {op}")
    if op in ("Exists", "DoesNotExist") and values:
        raise ShapeError(f"{field}.values", raw.get("values"), f"no values for {op}")
    if op in ("Gt", "Lt") and (len(values) != 1 or _int(values[0]) is None):
        raise ShapeError(f"{field}.values", raw.get("values"), f"exactly one integer for {op}")
    return Expr(key, op, frozenset(values))


def node_requirement(pod: Mapping[str, Any], prefix: str = "") -> NodeRequirement:
    """The pod's nodeSelector and required node affinity; ShapeError names the first malformed field."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return NodeRequirement()
    selector = spec.get("nodeSelector")
    pairs: list[tuple[str, str]] = []
    if selector is not None:
        if not isinstance(selector, dict):
            raise ShapeError(f"{prefix}spec.nodeSelector", selector, "an object of string values")
        for k, v in selector.items():
            if not isinstance(v, str):
                raise ShapeError(key_path(f"{prefix}spec.nodeSelector", k), v, "a string")
            pairs.append((k, v))
    field = f"{prefix}spec.affinity"
    affinity = spec.get("affinity")
    if affinity is None:
        return NodeRequirement(tuple(pairs))
    if not isinstance(affinity, dict):
        raise ShapeError(field, affinity, "an object")
    node_affinity = affinity.get("nodeAffinity")
    if node_affinity is None:
        return NodeRequirement(tuple(pairs))
    if not isinstance(node_affinity, dict):
        raise ShapeError(f"{field}.nodeAffinity", node_affinity, "an object")
    required = node_affinity.get(_REQUIRED)
    field = f"{field}.nodeAffinity.{_REQUIRED}"
    if required is None:
        return NodeRequirement(tuple(pairs))
    if not isinstance(required, dict):
        raise ShapeError(field, required, "an object with nodeSelectorTerms")
    terms = []
    for i, t in enumerate(_list(required.get("nodeSelectorTerms"), f"{field}.nodeSelectorTerms",
                                "node selector terms")):
        where = f"{field}.nodeSelectorTerms[{i}]"
        if not isinstance(t, dict):
            raise ShapeError(where, t, "an object with matchExpressions and matchFields")
        exprs = tuple(_expr(e, f"{where}.matchExpressions[{j}]", False)
                      for j, e in enumerate(_list(t.get("matchExpressions"), f"{where}.matchExpressions",
                                                  "expressions")))
        fields = tuple(_expr(e, f"{where}.matchFields[{j}]", True)
                       for j, e in enumerate(_list(t.get("matchFields"), f"{where}.matchFields", "expressions")))
        terms.append(Term(exprs, fields))
    return NodeRequirement(tuple(pairs), tuple(terms))


def scheduler_refusal(pod_scheduler: str, scheduler_name: str, resource: str) -> str:
    """Pods asking for our cards are ours only under our profile ("" = the API default).

    Extenders are global in kube-scheduler: another profile's pod that asks for `resource` reaches
    us too. It bypassed admission (which routes such pods to our profile), so it is not placed.
    """
    scheduler = pod_scheduler or "default-scheduler"
    if scheduler == scheduler_name:
        return ""
    return (f'schedulerName "{scheduler}" is not "{scheduler_name}": pods asking for {resource} are placed '
            f"by {scheduler_name} only (admission routes them there; this pod bypassed it)")


@dataclass(frozen=True)
class BindCandidate:
    """What bind knows of a pod when it decides whether to place it (from filter or the API server)."""

    namespace: str
    name: str
    asks_slices: bool  # pod_request() found a slice request
    scheduler_name: str  # spec.schedulerName ("" = the API default, default-scheduler)
    requirement: NodeRequirement


def bind_refusal(pod: BindCandidate, node: str, labels: Mapping[str, str] | None, scheduler_name: str,
                 resource: str) -> str:
    """Why our bind must not place this pod on this node ("" = it may). `labels` None: not read.

    Only pods that ask for our cards, scheduled by our profile, on a node they may go to: anything
    else would let a bind call write an allocation record nobody booked, or move a pod elsewhere.
    """
    ref = f"{pod.namespace}/{pod.name}"
    if not pod.asks_slices:
        return f"bind: pod {ref} asks for no {resource}; this extender binds only pods it places on cards"
    why = scheduler_refusal(pod.scheduler_name, scheduler_name, resource)
    if why:
        return f"bind: pod {ref}: {why}"
    if not is_dns_subdomain(node):
        return f"bind: node {node!r} is not a node name"
    if pod.requirement.unconstrained:
        return ""
    if labels is None:
        return f"bind: the labels of node {node} could not be read to check the pod's node constraints"
    why = pod.requirement.refusal(node, labels)
    return f"bind: pod {ref} cannot go to node {node}: {why}" if why else ""
