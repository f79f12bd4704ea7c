"""Namespace quotas on slices: the forms Kubernetes does not enforce for extended resources.

What the API server already does (kube-apiserver v1.36, checked in its source): the ResourceQuota
admission plugin runs after every mutating webhook, so it counts the amounts our webhook fills in
for exclusive and multi-card pods (the API server defaults requests to limits after the patch). For
an extended resource it counts and enforces only `requests.<name>` (e.g.
`requests.mthreads.com/sgpu-memory`), atomically (compare-and-swap on the quota's `status.used`),
and only once the quota controller has written `status.hard` and `status.used`. Its refusal:
`exceeded quota: <quota>, requested: <key>=<n>, used: <key>=<n>, limited: <key>=<n>`.

The API server also stores `limits.<name>` (the form HAMi documents, e.g.
`limits.mthreads.com/sgpu-memory`) and the bare `<name>`, but never counts or enforces them for an
extended resource. Those two forms are what this module judges: the pod's asks (after our fills)
plus what the namespace's live pods hold, against every such quota whose scopes select the pod.
Pure: the webhook reads the quotas and pods and passes them in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from fractions import Fraction
from typing import Any

from shared.config import Config
from shared.domain.lifecycle import peak
from shared.domain.quantity import exact
from shared.domain.request import ContainerAsk, RequestError, read_asks
from shared.domain.trust import asks_slices
from shared.domain.views import picked, spec_view

LIMITS_PREFIX = "limits."
TERMINAL_PHASES = ("Succeeded", "Failed")  # the API server stops charging a pod once it is terminal


def is_terminal(pod: Mapping[str, Any]) -> bool:
    """Whether the pod has ended (its phase Succeeded or Failed): it holds no card and no quota any more."""
    return (pod.get("status") or {}).get("phase") in TERMINAL_PHASES


class QuotaError(ValueError):
    """A quota or a pod we cannot read: the webhook refuses (fail closed) with this message."""


@dataclass(frozen=True)
class QuotaLimit:
    quota: str
    key: str  # as written in spec.hard
    resource: str  # the pod resource it limits
    hard: int


def enforced_keys(cfg: Config) -> dict[str, str]:
    """spec.hard key -> pod resource, for the forms only our webhook enforces."""
    out: dict[str, str] = {}
    for resource in cfg.slice_resources:
        out[LIMITS_PREFIX + resource] = resource
        out[resource] = resource
    return out


def quantity(text: object, where: str) -> Fraction:
    """A Kubernetes quantity (never negative here) exactly, or QuotaError naming `where`."""
    ok = isinstance(text, (str, int)) and not isinstance(text, bool) and len(str(text)) <= 64
    value = exact(str(text)) if ok else None
    if value is None:
        raise QuotaError(f"{where}={text!r} is not a quantity (or out of range); cannot check the pod against it")
    return value


def hard_value(text: object, where: str) -> int:
    """A quota amount as a whole number of units, rounded down (a fraction of a unit grants nothing)."""
    return int(quantity(text, where))  # floor: values are never negative here


def limits_of(quota: Mapping[str, Any], cfg: Config) -> list[QuotaLimit]:
    meta, spec = quota.get("metadata") or {}, quota.get("spec") or {}
    name = str(meta.get("name", "?"))
    keys = enforced_keys(cfg)
    hard = spec.get("hard") or {}
    return [QuotaLimit(name, key, keys[key], hard_value(value, f'quota "{name}" spec.hard {key}'))
            for key, value in sorted(hard.items()) if key in keys]


def asks_usage(asks: Sequence[ContainerAsk], cfg: Config) -> dict[str, int]:
    """What a pod is charged per resource: the most its containers hold at once (init containers one at a
    time, sidecars beside the apps: shared/domain/lifecycle.py), as the API server charges `requests.*`."""
    out: dict[str, int] = {}
    for resource, field in zip(cfg.slice_resources, ("count", "memory", "cores"), strict=True):
        held = peak((a.kind, getattr(a, field) or 0) for a in asks)  # sidecars beside the apps
        if held:
            out[resource] = held
    return out


def stuck_terminating(pod: Mapping[str, Any], now: float) -> bool:
    """Past its deletion time plus its grace period (e.g. its node is lost): the API server stops charging
    it (QuotaV1Pod), so the namespace can start its replacement. `now`: seconds since the epoch."""
    meta = pod.get("metadata") or {}
    at, grace = meta.get("deletionTimestamp"), meta.get("deletionGracePeriodSeconds")
    if not isinstance(at, str) or isinstance(grace, bool) or not isinstance(grace, int):
        return False
    try:
        deleted = datetime.fromisoformat(at)
    except ValueError:
        return False  # unreadable: charged
    if deleted.tzinfo is None:
        return False
    return now > deleted.timestamp() + grace


# What judge_quotas reads of a counted pod besides its containers (in_scope, stuck_terminating, the messages)
VIEW_META = ("name", "namespace", "uid", "deletionTimestamp", "deletionGracePeriodSeconds")
VIEW_SPEC = ("activeDeadlineSeconds", "priorityClassName", "affinity", "resources")
VIEW_CONTAINER = ("name", "resources", "restartPolicy")


def quota_view(pod: Mapping[str, Any], cfg: Config) -> dict[str, Any] | None:
    """What judge_quotas reads of a live pod of the namespace, or None for a pod that names none of our
    resources (it holds nothing a quota of ours counts, whatever else it says). Kept by the webhook in place of
    the pod while it reads the namespace's pods (a pod's JSON is ~15 KiB decoded; this, a few hundred bytes).
    tests/unit/test_quota_view.py: judge_quotas decides alike on the pods and on their views."""
    if not asks_slices(pod, cfg):
        return None

    return {"metadata": picked(pod.get("metadata"), VIEW_META),
            "spec": spec_view(pod.get("spec"), VIEW_SPEC, VIEW_CONTAINER),
            "status": picked(pod.get("status"), ("phase",))}


def pod_usage(pod: Mapping[str, Any], cfg: Config, now: float = 0.0) -> dict[str, int]:
    """What a pod already in the namespace holds (nothing once it is terminal or stuck terminating)."""
    if is_terminal(pod) or stuck_terminating(pod, now):
        return {}
    try:
        return asks_usage(read_asks(pod, cfg), cfg)
    except RequestError as e:
        name = (pod.get("metadata") or {}).get("name", "?")
        raise QuotaError(f'cannot count pod "{name}" against the quota: {"; ".join(e.problems)}') from e


def _affinity_crosses_namespaces(spec: Mapping[str, Any]) -> bool:
    affinity = spec.get("affinity") or {}
    for kind in ("podAffinity", "podAntiAffinity"):
        block = affinity.get(kind) or {}
        terms = list(block.get("requiredDuringSchedulingIgnoredDuringExecution") or [])
        terms += [w.get("podAffinityTerm") or {} for w in block.get("preferredDuringSchedulingIgnoredDuringExecution")
                  or []]
        if any(t.get("namespaces") or t.get("namespaceSelector") is not None for t in terms):
            return True
    return False


def _best_effort(spec: Mapping[str, Any]) -> bool:
    """The API server's QoS rule: no positive cpu or memory request or limit, read from the pod-level
    resources when the pod has them (spec.resources), else from every container."""
    pod_level = spec.get("resources")  # present (even empty): it alone decides, as in ComputePodQOS
    holders = [pod_level] if isinstance(pod_level, dict) else [c.get("resources") or {} for c in
                                             (spec.get("initContainers") or []) + (spec.get("containers") or [])]
    return not any(quantity(amount, f"{name} of the pod") > 0
                   for res in holders for part in (res.get("limits"), res.get("requests"))
                   for name, amount in (part or {}).items() if name in ("cpu", "memory"))


def _scope_selects(scope: str, operator: str, values: Sequence[str], pod: Mapping[str, Any]) -> bool:
    spec = pod.get("spec") or {}
    if scope in ("Terminating", "NotTerminating"):
        deadline = spec.get("activeDeadlineSeconds")
        terminating = isinstance(deadline, int) and deadline >= 0
        return terminating == (scope == "Terminating")
    if scope in ("BestEffort", "NotBestEffort"):
        return _best_effort(spec) == (scope == "BestEffort")
    if scope == "PriorityClass":
        pc = spec.get("priorityClassName") or ""
        return {"In": pc in values, "NotIn": pc not in values, "Exists": bool(pc),
                "DoesNotExist": not pc}.get(operator, True)
    if scope == "CrossNamespacePodAffinity":
        return _affinity_crosses_namespaces(spec)
    return False  # scopes of other kinds (VolumeAttributesClass) never select a pod


def in_scope(quota: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """Whether the quota's scopes and scopeSelector select the pod (no scopes: every pod)."""
    spec = quota.get("spec") or {}
    terms = [(str(s), "Exists", ()) for s in spec.get("scopes") or []]
    for e in (spec.get("scopeSelector") or {}).get("matchExpressions") or []:
        terms.append((str(e.get("scopeName")), str(e.get("operator")), tuple(e.get("values") or ())))
    return all(_scope_selects(scope, op, values, pod) for scope, op, values in terms)


def judge_quotas(pod: Mapping[str, Any], asked: Mapping[str, int], quotas: Sequence[Mapping[str, Any]],
                 pods: Sequence[Mapping[str, Any]], cfg: Config, now: float = 0.0) -> str | None:
    """None when the pod fits every `limits.`/bare quota of its namespace, else the refusal.

    `asked`: the pod's charge after our fills (asks_usage); `pods`: the namespace's pods as the API
    server lists them now (the pod being created is not among them). Raises QuotaError when a quota
    or a counted pod cannot be read. `now` (seconds since the epoch; 0: none is) tells pods stuck terminating.
    """
    problems: list[str] = []
    usage: list[dict[str, int]] | None = None
    for q in quotas:
        limits = [lim for lim in limits_of(q, cfg) if asked.get(lim.resource)]
        if not limits or not in_scope(q, pod):
            continue
        if usage is None:
            usage = [pod_usage(p, cfg, now) for p in pods]
        selected = [u for p, u in zip(pods, usage, strict=True) if u and in_scope(q, p)]
        for lim in limits:
            want = asked[lim.resource]
            used = sum(u.get(lim.resource, 0) for u in selected)
            if used + want > lim.hard:
                left = max(lim.hard - used, 0)
                holders = sum(1 for u in selected if u.get(lim.resource))
                problems.append(f"exceeded quota: {lim.quota}, requested: {lim.key}={want}, left: {lim.key}={left} "
                                f"(used {used} by {holders} pod{'s' if holders != 1 else ''}, limited {lim.hard})")
    return "; ".join(problems) or None
