"""Why a pod is Pending: per candidate node and card, the reason the filter gives, who holds the card, and
what would make it fit (pure; the shells are controller/explain.py: `mtsched explain` and the extender's
/debug/explain).

Nothing here decides anew: a node's verdict is `fit()` (what the filter answers), a card's reason is
`card_rejection()` (the card rule the filter applies), and "what would make it fit" asks the same rule
again with the card's holders taken off one by one, largest first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from shared.domain.fit import (
    CARD_COMPUTE_EXHAUSTED,
    CARD_CORDONED,
    CARD_INSUFFICIENT_CORE,
    CARD_INSUFFICIENT_MEMORY,
    CARD_NOT_FOUND,
    CARD_NOT_HEALTH,
    CARD_SLICES_EXHAUSTED,
    CARD_TYPE_MISMATCH,
    CARD_UUID_MISMATCH,
    EXCLUSIVE_CONFLICT,
    GPU_POLICY,
    NOUSE_UUID,
    USE_UUID,
    CardNeed,
    CardView,
    accepted_capacities,
    card_rejection,
    card_rule,
    denied_cards,
    fit,
    need_for,
    policy_of,
)
from shared.domain.models import CardModel
from shared.domain.node import CORDON_ANNOTATION, mismatch_kind
from shared.domain.placement import NodeRequirement
from shared.domain.request import PIN_ANNOTATION, Mode, SliceRequest
from shared.domain.state import CardRecord, NodeSnapshot

USAGE_REASONS = (CARD_SLICES_EXHAUSTED, EXCLUSIVE_CONFLICT, CARD_INSUFFICIENT_MEMORY, CARD_COMPUTE_EXHAUSTED,
                 CARD_INSUFFICIENT_CORE)  # reasons that holders ending can clear


@dataclass(frozen=True)
class Holder:
    pod: str  # namespace/name (the uid when the reservation names no pod)
    memory: int  # units on this card
    cores: int
    slices: int
    state: str  # pending | bound


@dataclass(frozen=True)
class CardWhy:
    index: int
    device: str
    model: str
    capacity: int
    memory_used: int
    cores: int
    cores_used: int
    slices: int
    slice_limit: int
    health: str
    reason: str  # HAMi's reason name from card_rule; "" = this card takes the pod
    detail: str  # the numbers behind the reason
    fix: str  # what would make it fit
    holders: tuple[Holder, ...]


@dataclass(frozen=True)
class NodeWhy:
    node: str
    fits: tuple[int, ...] = ()  # cards the filter would choose; empty = does not fit
    reason: str = ""  # the filter's answer for the node ("N/M Reason, ..." or "node unregistered: ...")
    mismatch: str = ""  # the kind of capacity/label/model mismatch that closes the node (shared.domain.node)
    excluded: str = ""  # not a candidate: the pod's nodeSelector / node affinity keeps it off this node
    detail: str = ""
    cards: tuple[CardWhy, ...] = ()


@dataclass(frozen=True)
class Explanation:
    pod: str
    request: str  # the pod's request as the scheduler reads it
    summary: str
    problems: tuple[str, ...] = ()  # the request cannot be read (the filter places it nowhere)
    bound: str = ""  # the node it is bound to, if any
    nodes: tuple[NodeWhy, ...] = ()


def describe_request(req: SliceRequest) -> str:
    if req.mode is Mode.SLICE:
        model = f"only {CardModel(req.model).name} cards" if req.model else "any card model"
        return (f"slice of one card: {req.memory} units ({req.memory / 2:g} GiB) of memory, {req.cores} core "
                f"group(s), {req.slices} slice(s); {model}")
    model = CardModel(req.model).name + f" ({req.model} units)" if req.model else "any model"
    return f"{req.cards} whole card(s) ({req.mode.value}), {model}, each idle"


def holders_of(snap: NodeSnapshot) -> dict[int, tuple[Holder, ...]]:
    """Card index -> the reservations on it, largest memory first."""
    out: dict[int, list[Holder]] = {}
    for r in snap.reservations.values():
        for i in r.cards:
            out.setdefault(i, []).append(Holder(r.pod or r.uid, r.mem, r.cores, r.slices, r.state))
    return {i: tuple(sorted(hs, key=lambda h: (-h.memory, -h.cores, h.pod))) for i, hs in out.items()}


def _view(c: CardRecord) -> CardView:
    return CardView(c.index, c.health, c.capacity, c.mem_used, c.cores, c.cores_used, c.slices, c.slice_limit)


def _list(holders: Sequence[Holder]) -> str:
    return ", ".join(f"{h.pod} ({h.memory}{', pending' if h.state == 'pending' else ''})" for h in holders)


Rule = Callable[[CardView], str]


def _freeing(view: CardView, need_reason: str, rule: Rule, holders: Sequence[Holder]) -> list[Holder]:
    """Holders whose ending lets the card rule pass (largest first, by what blocks), or [] if none does."""
    key = {CARD_SLICES_EXHAUSTED: lambda h: (h.slices, h.memory),
           CARD_INSUFFICIENT_CORE: lambda h: (h.cores, h.memory),
           CARD_COMPUTE_EXHAUSTED: lambda h: (h.cores, h.memory)}.get(need_reason, lambda h: (h.memory, h.cores))
    gone: list[Holder] = []
    for h in sorted(holders, key=key, reverse=True):
        gone.append(h)
        view = replace(view, mem_used=max(0, view.mem_used - h.memory), cores_used=max(0, view.cores_used - h.cores),
                       slices=max(0, view.slices - h.slices))
        if not rule(view):
            return gone
    return []


def _advice(reason: str, view: CardView, req: SliceRequest, memory: int, cores: int, slices: int,
            device: str, holders: Sequence[Holder], rule: Rule) -> tuple[str, str]:
    """(detail, fix) for one card's reason."""
    held = f"; held by {_list(holders)}" if holders else ""
    if reason == CARD_NOT_FOUND:
        return "the node no longer reports this card" + held, "offered again once the node reports it"
    if reason == CARD_NOT_HEALTH:
        return "the card is unhealthy" + held, "repair the card (the device plugin reports it healthy again)"
    if reason == CARD_CORDONED:
        return f"cordoned in the node annotation {CORDON_ANNOTATION}" + held, \
            f"remove {device} from {CORDON_ANNOTATION} once the card is healthy (a cordon that covers devices " \
            "the node's allocatable lacks is what keeps its other cards offered: removed before, the node offers " \
            "none)"
    if reason == CARD_TYPE_MISMATCH:
        model = CardModel(view.capacity)
        if req.model and req.model != view.capacity:
            # the pin (or the webhook's model) decides: the pin given at creation, whole cards are asked in its units
            ask = ("and no sgpu-memory (the webhook then asks whole cards of it)" if req.whole_cards else
                   f"and an sgpu-memory {model.name} takes ({', '.join(map(str, model.valid_memory))})")
            return (f"the card is {model.name} ({view.capacity} units), the pod needs a {CardModel(req.model).name} "
                    f"card ({req.model} units)",
                    f"wait for a {CardModel(req.model).name} card, or create the pod with the annotation "
                    f"{PIN_ANNOTATION}: \"{view.capacity}\" {ask} to run it on {model.name} cards")
        bad = sorted({s.memory for s in req.shares if not s.empty and not model.accepts(s.memory)})
        return (f"the card is {model.name} ({view.capacity} units), the pod needs sgpu-memory "
                f"{', '.join(map(str, bad))}, not valid on {model.name}",
                f"use a card of that model, or ask a value {model.name} takes "
                f"({', '.join(map(str, model.valid_memory))})")
    if reason == CARD_UUID_MISMATCH:
        return f"{device} is excluded by the pod's {USE_UUID} / {NOUSE_UUID}", "change those annotations"
    if reason == CARD_SLICES_EXHAUSTED:
        detail = f"needs {slices} slice(s), {view.slices}/{view.slice_limit} in use"
    elif reason == EXCLUSIVE_CONFLICT:
        detail = ("needs an idle card (whole card)" if req.whole_cards else
                  f"needs an idle card ({GPU_POLICY}: mutex)") + f", {view.mem_used} units in use"
    elif reason == CARD_INSUFFICIENT_MEMORY:
        detail = f"needs {memory} units, {max(0, view.capacity - view.mem_used)} free"
    elif reason == CARD_COMPUTE_EXHAUSTED:
        detail = f"no core group left ({view.cores_used}/{view.cores} in use)"
    elif reason == CARD_INSUFFICIENT_CORE:
        detail = f"needs {cores} core group(s), {max(0, view.cores - view.cores_used)} free"
    else:
        return "", ""
    gone = _freeing(view, reason, rule, holders)
    if gone:
        fix = f"fits once {', '.join(h.pod for h in gone)} end{'s' if len(gone) == 1 else ''}"
    elif rule(replace(view, mem_used=0, cores_used=0, slices=0)):
        fix = "not even this card idle takes it: ask less (or raise the card's slice limit)"
    else:
        fix = "the card holds more than its reservations explain (the reconciler repairs such drift)"
    return detail + held, fix


def explain_node(snap: NodeSnapshot, req: SliceRequest, annotations: Mapping[str, str],
                 default_gpu_policy: str) -> NodeWhy:
    """One node: the filter's verdict (fit) and every card's reason (card_rejection / card_rule)."""
    if snap.error:
        # the filter's text for it (extender: "node unregistered: <why>")
        return NodeWhy(snap.node, reason=f"node unregistered: {snap.error}", mismatch=mismatch_kind(snap.error))
    states = snap.states()
    result = fit(states, req, annotations, default_gpu_policy)
    mutex = "mutex" in policy_of(annotations, GPU_POLICY, default_gpu_policy)
    by_index = {s.card.index: s for s in states}
    holders = holders_of(snap)
    cards: list[CardWhy] = []
    for idx in sorted(snap.cards):
        rec = snap.cards[idx]
        view = _view(rec)
        state = by_index.get(idx)
        need = need_for(req, rec.capacity, mutex, accepted_capacities(req, (rec.capacity,)),
                        denied_cards((state,), annotations) if state is not None else frozenset())
        # offered cards: the filter's own call; removed cards are never offered (the rule says CardNotFound)
        reason = card_rejection(state, req, annotations, mutex) if state is not None else card_rule(view, need)
        device = state.card.id if state is not None else f"{snap.node}-mthreads-{idx}"

        def rule(v: CardView, n: CardNeed = need) -> str:
            return card_rule(v, n)

        detail, fix = _advice(reason, view, req, need.memory, need.cores, need.slices, device,
                              holders.get(idx, ()), rule) if reason else ("", "")
        cards.append(CardWhy(idx, device, CardModel(rec.capacity).name, rec.capacity, rec.mem_used, rec.cores,
                             rec.cores_used, rec.slices, rec.slice_limit, rec.health, reason, detail, fix,
                             holders.get(idx, ())))
    detail = ""
    if req.cards > len(states):
        detail = f"the node offers {len(states)} card(s), the pod needs {req.cards}"
    elif not result.ok and req.cards > 1:
        usable = sum(1 for c in cards if not c.reason)
        detail = f"{usable} of the {req.cards} cards the pod needs are free"
    return NodeWhy(snap.node, result.cards, result.reason, detail=detail, cards=tuple(cards))


def explain(pod: str, req: SliceRequest | None, annotations: Mapping[str, str], snaps: Mapping[str, NodeSnapshot],
            default_gpu_policy: str, *, problems: Sequence[str] = (), bound: str = "",
            requirement: NodeRequirement | None = None,
            labels: Mapping[str, Mapping[str, str]] | None = None, unkept: str = "") -> Explanation:
    """The whole answer for one pod. `labels` (node -> labels, from the API server) lets the pod's nodeSelector
    and required node affinity mark the nodes kube-scheduler never offers it; without them every node of
    the snapshots is a candidate. `unkept`: why the extenders place no slice pod now (shared/domain/upkeep.py),
    which comes before what the cards say."""
    if problems:
        return Explanation(pod, "unreadable", "the filter places this pod nowhere: " + "; ".join(problems),
                           tuple(problems), bound)
    if req is None:
        return Explanation(pod, "no Moore Threads slices", "the pod asks for no sliced card: mtsched does not "
                           "place it", bound=bound)
    nodes: list[NodeWhy] = []
    for name in sorted(snaps):
        why = ""
        if requirement is not None and labels is not None and not requirement.unconstrained:
            why = requirement.refusal(name, labels.get(name, {}))
        if why:
            nodes.append(NodeWhy(name, excluded=why))
            continue
        nodes.append(explain_node(snaps[name], req, annotations, default_gpu_policy))
    candidates = [n for n in nodes if not n.excluded]
    fitting = [n for n in candidates if n.fits]
    mismatched = [n for n in candidates if n.mismatch]
    if bound:
        summary = f"bound to {bound}"
    elif fitting:
        summary = (f"fits on {len(fitting)} of {len(candidates)} candidate node(s) ("
                   + ", ".join(f"{n.node} cards {','.join(map(str, n.fits))}" for n in fitting[:5])
                   + "); if it stays Pending, kube-scheduler's own plugins refuse it (kubectl describe pod)")
    elif not candidates:
        summary = f"no candidate node: {len(nodes)} node(s) with sliced cards, none matches the pod's node " \
                  "selector or affinity"
    else:
        summary = f"no card fits on any of {len(candidates)} candidate node(s)"
    if mismatched and not bound:
        summary += (f"; {len(mismatched)} node(s) offer no card because their capacity, label or card model "
                    f"disagrees with the configuration: {', '.join(n.node for n in mismatched)}")
    if unkept and not bound:
        summary = f"placed nowhere now: {unkept}; once a watcher keeps it: {summary}"
    return Explanation(pod, describe_request(req), summary, bound=bound, nodes=tuple(nodes))
