"""The admission decision: allow with a JSONPatch, or deny with a message a user can act on.

Pure: given the pod, the configuration and the card capacities the cluster's nodes report, it
returns a Decision. The webhook server only decodes the review and encodes this answer.

Mixed fleets: pod resources are immutable after admission, so exclusive (`vgpu: 1` alone) and
multi-card pods get a concrete per-card memory here. The rule: the model pinned by the pod's
`mtsched.io/card-memory` annotation; else the largest configured model that some node reports;
else (no node reports sliced cards yet) the largest configured model. The scheduler then places
such pods only on cards of exactly that capacity.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.config import Config
from shared.domain.annotations import MTHREADS_OWNED_KEYS, SCHEDULER_OWNED_KEYS
from shared.domain.fit import GPU_POLICY, NODE_POLICY, SCORING_WEIGHTS, selection_problems
from shared.domain.models import CORES_PER_CARD, CardModel, describe_models, union_memory_values
from shared.domain.node import mismatch_causes
from shared.domain.quota import asks_usage
from shared.domain.request import (
    PIN_ANNOTATION,
    ContainerAsk,
    Mode,
    RequestError,
    SliceRequest,
    card_accepts,
    pinned_model,
    pod_request,
    read_asks,
    shape_request,
)
from shared.domain.shapes import describe, pod_problems

REQUEST_GPU_NUM = "mthreads.com/request-gpu-num"  # HAMi writes it for vgpu > 1; kept for compatibility


@dataclass(frozen=True)
class Decision:
    allowed: bool
    message: str = ""
    patch: tuple[dict[str, Any], ...] = ()
    warnings: tuple[str, ...] = field(default_factory=tuple)
    code: int = 200
    # what the admitted pod is charged per resource after the fills (shared/domain/quota.py)
    usage: tuple[tuple[str, int], ...] = ()


def deny(message: str, code: int = 403) -> Decision:
    return Decision(False, message=message, code=code)


def _esc(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


# What the extender reads of the placement annotations (shared/domain/fit.py policy_of, card_order; topk.py): HAMi's
# card policies may be chained with commas, and its numa and topology-aware do nothing for mthreads cards there too.
POLICY_VALUES = {GPU_POLICY: ("binpack", "spread", "mutex"), NODE_POLICY: ("binpack", "spread")}
HAMI_NO_OP_POLICIES = {GPU_POLICY: ("numa", "topology-aware"), NODE_POLICY: ()}


def policy_problems(annotations: Mapping[str, Any]) -> list[str]:
    """A placement policy annotation naming no policy (a typo would fall back to the default without a word)."""
    out: list[str] = []
    for key, allowed in POLICY_VALUES.items():
        raw = annotations.get(key)
        if not isinstance(raw, str) or not raw.strip():
            continue  # unset or empty: the default (pod_problems has checked the type)
        known = (*allowed, *HAMI_NO_OP_POLICIES[key])
        items = [p.strip().lower() for p in raw.split(",")] if key == GPU_POLICY else [raw.strip().lower()]
        if not all(p in known for p in items):
            extra = (" (or a comma list of them; HAMi's " + " and ".join(HAMI_NO_OP_POLICIES[key])
                     + " are accepted and do nothing for mthreads cards)") if key == GPU_POLICY else ""
            out.append(f"annotation {key}={describe(raw)} names no policy; allowed: {', '.join(allowed)}{extra}")
    return out


def whole_card_model(pod: Mapping[str, Any], cfg: Config, reported: Collection[int]) -> CardModel:
    """Per-card memory for exclusive and multi-card pods (see module docstring)."""
    pin = pinned_model(pod, cfg)
    if pin is not None:
        return pin
    seen = [m for m in cfg.models if m.memory in reported]
    return max(seen or cfg.models)


def _resource_patch(pod: Mapping[str, Any], asks: list[ContainerAsk],
                    fills: dict[int, dict[str, int]]) -> list[dict[str, Any]]:
    """JSONPatch ops setting limits (and requests when present) for injected values."""
    ops: list[dict[str, Any]] = []
    spec = pod.get("spec") or {}
    n_init = len(spec.get("initContainers") or [])
    for i, values in fills.items():
        ask = asks[i]
        base = f"/spec/initContainers/{i}" if ask.init else f"/spec/containers/{i - n_init}"
        container = (spec.get("initContainers") or [])[i] if ask.init else spec["containers"][i - n_init]
        res = container.get("resources") or {}
        if not container.get("resources"):
            ops.append({"op": "add", "path": f"{base}/resources", "value": {}})
        for part in ("limits", "requests"):
            present = res.get(part)
            if part == "requests" and not present:
                continue  # requests default to limits for extended resources
            if present is None:
                ops.append({"op": "add", "path": f"{base}/resources/{part}", "value": {}})
            for name, value in values.items():
                if part == "requests" and name not in (present or {}):
                    continue
                ops.append({"op": "add", "path": f"{base}/resources/{part}/{_esc(name)}",
                            "value": str(value)})
    return ops


MAX_NODE_WARNINGS = 3  # the API server may cut long warning lists; `mtsched explain` names every node
WARNING_CHARS = 256  # the API server may truncate longer warnings


def mismatch_warnings(req: SliceRequest, reported: Collection[int], mismatched: Mapping[str, str]) -> list[str]:
    """Warnings for a pod that no usable card of the cluster can serve while nodes report sliced cards they
    do not offer (capacity, sgpu.cores label or card model disagree, or card annotations cannot be read;
    `mismatched`: node -> why): the pod
    could only go there, and will stay Pending until they are fixed."""
    if not mismatched or any(card_accepts(c, req) for c in reported):
        return []
    names = sorted(mismatched)
    out = [f"no node offers a card this pod can use: {len(names)} node(s) report sliced cards but offer none "
           f"(their {mismatch_causes(mismatched.values())}); the pod stays Pending until they are fixed "
           "(mtsched explain NAMESPACE/POD)"]
    out += [f"node {n}: {mismatched[n]}"[:WARNING_CHARS] for n in names[:MAX_NODE_WARNINGS]]
    if len(names) > MAX_NODE_WARNINGS:
        out.append(f"and {len(names) - MAX_NODE_WARNINGS} more node(s)")
    return out


def decide(pod: Mapping[str, Any], cfg: Config, reported: Collection[int] = (),
           mismatched: Mapping[str, str] | None = None) -> Decision:
    """Admission of a pod CREATE. `reported` = per-card capacities (units) of the cluster's usable sliced cards;
    `mismatched` = nodes that report sliced cards but offer none, and why (for the warning only)."""
    shape = pod_problems(pod)
    if shape:  # the rules below read only fields of the types checked here
        return deny("; ".join(shape), code=400)
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    annotations = meta.get("annotations") or {}
    if not spec.get("containers"):
        return deny("pod has no containers")
    try:
        asks = read_asks(pod, cfg)
    except RequestError as e:
        return deny("; ".join(e.problems))
    mine = [a for a in asks if a.asks_slices]
    # A forged record would steer the vendor device plugin. The mthreads keys are refused on any pod;
    # HAMi's generic keys (shared with its other vendors) only on pods asking for mthreads slices.
    owned = sorted(k for k in annotations if k in SCHEDULER_OWNED_KEYS
                   and (k in MTHREADS_OWNED_KEYS or mine))
    if owned:
        return deny(f"annotations {', '.join(owned)} are written by {cfg.scheduler_name} when it binds the "
                    "pod; remove them from the pod you create")
    if not mine:
        return Decision(True)  # not ours: mthreads.com/gpu alone and CPU pods pass untouched
    cr, mr, kr = cfg.slice_resources
    problems: list[str] = []
    scheduler = spec.get("schedulerName") or "default-scheduler"
    if scheduler != cfg.scheduler_name and not (
            scheduler == "default-scheduler" and cfg.force_overwrite_default_scheduler):
        problems.append(f'schedulerName "{scheduler}": pods asking for {cr} must be scheduled by '
                        f'"{cfg.scheduler_name}" (leave schedulerName unset)')
    if spec.get("nodeName"):
        problems.append(f'spec.nodeName "{spec["nodeName"]}" is set: pods asking for {cr} are placed on a '
                        f"card by {cfg.scheduler_name}; use a nodeSelector instead")
    # asks are in container order (init first), so each container is paired with its own ask: one pass
    count_in_requests_only: set[int] = set()
    problems.extend(privileged_problems(pod, asks))
    for i, (c, a) in enumerate(zip((spec.get("initContainers") or []) + spec["containers"], asks, strict=True)):
        res = c.get("resources") or {}
        if a.count is not None and cr not in (res.get("limits") or {}):
            count_in_requests_only.add(i)
    for a in mine:
        if a.memory_in_requests_only or a.cores_in_requests_only:
            which = mr if a.memory_in_requests_only else kr
            problems.append(f'container "{a.name}": {which} is set under requests only; set it under limits')
    try:
        pin = pinned_model(pod, cfg)
    except RequestError as e:
        problems.extend(e.problems)
        pin = None
    problems.extend(policy_problems(annotations))
    problems.extend(selection_problems(annotations))
    if problems:
        return deny("; ".join(problems))

    union = union_memory_values(cfg.models)
    whole = whole_card_model(pod, cfg, reported)
    fills: dict[int, dict[str, int]] = {}
    warnings: list[str] = []
    for i, a in enumerate(asks):
        if not a.asks_slices or a.count is None or a.whole_gpu:
            continue  # shape_request reports these
        if a.count > 1:
            per_card = a.memory // a.count if a.memory is not None and a.memory % a.count == 0 else None
            if a.memory is not None and CardModel(per_card or 0) not in cfg.models:
                problems.append(f'container "{a.name}": {whole_cards_problem(a.memory, a.count, cfg)} or be left out')
                continue
            model = CardModel(per_card) if per_card else whole
            fill = {}
            if a.memory is None:
                fill[mr] = a.count * model.memory
            if a.cores is None:
                fill[kr] = a.count * CORES_PER_CARD
            if fill:
                fills[i] = fill
                warnings.append(f'container "{a.name}": {a.count} whole {model.name} cards '
                                f"({a.count} x {model.memory} units = {a.count * model.memory_gib:g} GiB)")
        elif a.memory is None:
            if a.cores is None or a.cores == CORES_PER_CARD:
                fills[i] = {mr: whole.memory, kr: CORES_PER_CARD}
                warnings.append(f'container "{a.name}": exclusive mode, the whole {whole.name} card '
                                f"({whole.memory} units = {whole.memory_gib:g} GiB, "
                                f"{CORES_PER_CARD} core groups)")
        else:
            if a.memory not in union:
                problems.append(slice_size_problem(a.name, a.memory, cfg))
            elif pin is not None and not pin.accepts(a.memory):
                problems.append(f'container "{a.name}": {mr}={a.memory} is not valid on {pin.name} pinned by '
                                f"{PIN_ANNOTATION}; allowed: {', '.join(map(str, pin.valid_memory))}")
            if a.cores is None:
                fills[i] = {kr: cfg.default_cores}
    for i in count_in_requests_only:
        # the API server refuses an extended resource under requests without the same limit ("Limit must be set
        # for non overcommitable resources", naming no resource): HAMi's "count requested without limits" works
        fills.setdefault(i, {})[cr] = asks[i].count or 0
    if problems:
        return deny("; ".join(problems))
    try:  # the sharing rules on what the user wrote, before our fills: a refusal names the user's own values
        shape_request(asks, cfg, pin.memory if pin else None)
    except RequestError as e:
        return deny("; ".join(e.problems))
    completed = [
        ContainerAsk(a.name, a.init, a.count, fills.get(i, {}).get(mr, a.memory),
                     fills.get(i, {}).get(kr, a.cores), a.whole_gpu, sidecar=a.sidecar)
        for i, a in enumerate(asks)
    ]
    try:
        req = shape_request(completed, cfg, pin.memory if pin else None)
    except RequestError as e:
        return deny("; ".join(e.problems))
    assert req is not None
    if not req.whole_cards:
        # the scheduler's own rule (card_accepts; the pin is req.model), and the peak must fit an empty card
        fitting = [m for m in cfg.models if card_accepts(m.memory, req) and req.memory <= m.memory]
        if not fitting:
            return deny(f"the pod's slice containers share one card and ask {req.memory} {mr} in all "
                        f"({', '.join(f'{s.name}={s.memory}' for s in req.shares if not s.empty)}); "
                        f"no configured card model holds that: memoryPerCard {describe_models(cfg.models)}")

    warnings.extend(mismatch_warnings(req, reported, mismatched or {}))
    if SCORING_WEIGHTS in annotations:
        # HAMi reads it (and fails the pod's filter when it is malformed); ignored without a word, a pod moved
        # over from HAMi would be placed by other weights than its owner chose
        warnings.append(f"annotation {SCORING_WEIGHTS} is HAMi's and is not read by {cfg.scheduler_name}: "
                        "cards are scored with equal slot, core and memory weights (HAMi's default)")
    patch: list[dict[str, Any]] = []
    if spec.get("schedulerName") != cfg.scheduler_name:
        patch.append({"op": "add" if "schedulerName" not in spec else "replace",
                      "path": "/spec/schedulerName", "value": cfg.scheduler_name})
    patch.extend(_resource_patch(pod, asks, fills))
    if req.cards > 1:
        if not annotations:
            patch.append({"op": "add", "path": "/metadata/annotations", "value": {}})
        patch.append({"op": "add", "path": f"/metadata/annotations/{_esc(REQUEST_GPU_NUM)}",
                      "value": str(req.cards)})
    return Decision(True, patch=tuple(patch), warnings=tuple(warnings),
                    usage=tuple(asks_usage(completed, cfg).items()))


def _our_resources(pod: Mapping[str, Any], cfg: Config) -> list[tuple[str, tuple[object, ...]]]:
    """(container, its mthreads values under limits and requests) per container, init first."""
    names = (*cfg.slice_resources, cfg.whole_card_resource_name)
    spec = pod.get("spec") or {}
    out: list[tuple[str, tuple[object, ...]]] = []
    for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        res = c.get("resources") or {}
        lim, req = res.get("limits") or {}, res.get("requests") or {}
        out.append((str(c.get("name", "?")), tuple((lim.get(n), req.get(n)) for n in names)))
    return out


def judge_update(old: Mapping[str, Any], new: Mapping[str, Any], user: str, cfg: Config) -> Decision:
    """Admission of a pod UPDATE (`user`: who sends it).

    Pod resources are immutable after creation (in-place resize changes cpu and memory only), so the
    card resources must stay what was admitted and booked: a change is denied. Everything else is
    allowed for now; this is the seam for further UPDATE rules (e.g. scheduler-owned annotations
    written only by our bind, judged from `old`, `new` and `user`).
    """
    for which, pod in (("oldObject", old), ("object", new)):
        shape = pod_problems(pod)
        if shape:
            return deny(f"{which}: " + "; ".join(shape), code=400)
    before, after = _our_resources(old, cfg), _our_resources(new, cfg)
    if len(before) != len(after):
        return deny(f"the pod's containers changed from {len(before)} to {len(after)}; its card resources "
                    "are fixed when it is created")
    for (name, was), (_, now) in zip(before, after, strict=True):
        if was != now:
            return deny(f'container "{name}": {", ".join(cfg.slice_resources)} and {cfg.whole_card_resource_name} '
                        "cannot change after the pod is created (they were admitted and booked as they were)")
    return Decision(True)


def privileged_problems(pod: Mapping[str, Any], asks: Sequence[ContainerAsk]) -> list[str]:
    """A privileged container sees every card: one holding a slice is refused (admission and placement)."""
    spec = pod.get("spec") or {}
    return [f'container "{a.name}" is privileged: a privileged container sees every card, so it cannot hold a slice'
            for c, a in zip([*(spec.get("initContainers") or []), *(spec.get("containers") or [])], asks, strict=True)
            if a.asks_slices and (c.get("securityContext") or {}).get("privileged")]


def slice_size_problem(name: str, memory: int, cfg: Config) -> str:
    """A slice's `sgpu-memory` that no configured card model accepts, with what is allowed."""
    union = union_memory_values(cfg.models)
    return (f'container "{name}": {cfg.slice_resources[1]}={memory} is not a valid slice size; allowed: '
            f"{', '.join(map(str, union))} (memoryPerCard {describe_models(cfg.models)})")


def whole_cards_problem(memory: int, cards: int, cfg: Config) -> str:
    """A multi-card ask whose memory is not `cards` x a configured card's memory."""
    cr, mr, _ = cfg.slice_resources
    return (f"{mr}={memory} with {cr}={cards}: multi-card pods take whole cards; {mr} must be {cr} x a card's "
            "memory (" + ", ".join(f"{cards * m.memory} for {m.name}" for m in cfg.models) + ")")


def placement_request(pod: Mapping[str, Any], cfg: Config) -> SliceRequest | None:
    """`pod_request` for a pod about to be placed (the extender's filter, bind, preempt and `mtsched explain`):
    also the webhook's rules on the final pod that `pod_request` leaves to admission, since the pod the API
    server stores is what the last mutating webhook left (another webhook may run after ours, and none runs in
    the namespaces ours is not sent): a privileged container holding a slice, an `sgpu-memory` no configured card
    model accepts, a multi-card pod whose per-card memory is no model, a placement policy or `use-gpuuuid` that
    names none. Not applied to pods already placed (the watchers book what a bound pod holds, `pod_request`): a
    rule changed since does not unbook them."""
    req = pod_request(pod, cfg)
    if req is None:
        return None
    problems = privileged_problems(pod, read_asks(pod, cfg))
    union = union_memory_values(cfg.models)
    if req.mode is Mode.SLICE:
        problems.extend(slice_size_problem(s.name, s.memory, cfg)
                        for s in req.shares if not s.empty and s.memory not in union)
    elif req.mode is Mode.MULTI and req.model is not None and CardModel(req.model) not in cfg.models:
        problems.append(whole_cards_problem(req.cards * req.model, req.cards, cfg))
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    problems.extend(policy_problems(annotations))
    problems.extend(selection_problems(annotations))
    if problems:
        raise RequestError(problems)
    return req
