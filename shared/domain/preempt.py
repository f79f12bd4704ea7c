"""Card-aware preemption: whether kube-scheduler's victims on a node free a card for the preemptor (pure).

kube-scheduler's dry run (DefaultPreemption's SelectVictimsOnNode) removes the node's lower-priority pods,
then puts them back, most important first, while the preemptor still passes its own filter plugins (the
extender is not asked); what stays out are its victims. Those plugins are monotone in the pods present
(sgpu-memory, sgpu-core, cpu, memory, pod count are node totals), so each victim is needed: with any one of
them left on the node the preemptor fails them. kube-scheduler does not check the extender's answer against
its filters, it evicts what it is told. So a node's answer is all or nothing: the whole proposal when, with
its card holders gone, the preemptor fits `req.cards` cards under the filter's own rule (`fit`, i.e.
`card_rule`); else nothing, the node is dropped (the victims may sit on several cards and free none of them
enough). A strict subset would be evicted for a preemptor that still fails kube-scheduler's filters there,
and a second round would evict the rest (tests/e2e/test_redteam_preempt_reprieve.py).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from shared.domain.fit import GPU_POLICY, CardState, apply, card_rejection, fit, policy_of
from shared.domain.request import SliceRequest

KEPT = "kept"  # with the proposal's card holders gone the preemptor fits the cards
UNCHANGED = "unchanged"  # a card already fits: the cards do not block, kube-scheduler's choice stands
NO_CARD = "no_card"  # the proposal frees no card the preemptor fits on: the node is dropped


@dataclass(frozen=True)
class Holding:
    """What one pod books on this node: the same amounts on each of `cards` (a reservation)."""

    cards: tuple[int, ...]
    memory: int
    cores: int
    slices: int


@dataclass(frozen=True)
class Choice:
    outcome: str
    victims: tuple[str, ...] = ()  # uids to evict: the proposal, or empty (drop the node)
    cards: tuple[int, ...] = ()  # where the preemptor fits once they go (KEPT)
    reason: str = ""  # NO_CARD: why, per card


@dataclass(frozen=True)
class Ahead:
    """A pod kube-scheduler nominated to this node after an earlier preemption, not bound yet, of a priority
    at least the judged pod's: kube-scheduler's own filters count it on the node (with nominated pods), so the
    cards leave it room first. Its victims' cards are what it was promised."""

    uid: str
    priority: int
    request: SliceRequest
    annotations: Mapping[str, str]  # what fit reads (use-/nouse-gpuuuid, gpu policy)
    victims: tuple[str, ...] = ()  # its victims here (uids): evicted for it, they may still hold their cards


def pod_priority(pod: Mapping[str, object]) -> int:
    """A pod's spec.priority (set by the API server's Priority admission); 0 without one, as kube-scheduler."""
    spec = pod.get("spec")
    value = spec.get("priority") if isinstance(spec, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def plan_ahead(states: Sequence[CardState], holdings: Mapping[str, Holding], ahead: Sequence[Ahead],
               default_gpu_policy: str = "spread", gone: Collection[str] = ()
               ) -> tuple[list[CardState], dict[str, tuple[int, ...]]]:
    """The cards with each nominated pod booked where the filter will place it once its victims are gone,
    highest priority first (then by uid, so every caller plans alike), and uid -> the cards planned. Booked on
    `states` as they are: a card its victims still hold is over-full meanwhile, so nobody else fits there
    either. One that fits nowhere even then is left out. `holdings`: the node's reservations by uid; `gone`:
    pods the caller already took out of `states` (not taken out twice)."""
    victims = {v for a in ahead for v in a.victims if v in holdings and v not in gone}
    future = _without(states, [holdings[v] for v in sorted(victims)])
    out, planned = list(states), {}
    for a in sorted(ahead, key=lambda a: (-a.priority, a.uid)):
        got = fit(future, a.request, a.annotations, default_gpu_policy)
        if got.ok:
            future = apply(future, a.request, got.cards)
            out = apply(out, a.request, got.cards)
            planned[a.uid] = got.cards
    return out, planned


def _without(states: Sequence[CardState], gone: Sequence[Holding]) -> list[CardState]:
    """The node's cards once the pods holding `gone` are evicted."""
    out = []
    for s in states:
        i = s.card.index
        mem = sum(h.memory for h in gone if i in h.cards)
        cores = sum(h.cores for h in gone if i in h.cards)
        slices = sum(h.slices for h in gone if i in h.cards)
        if mem or cores or slices:
            s = replace(s, memory_used=max(0, s.memory_used - mem), cores_used=max(0, s.cores_used - cores),
                        slices_used=max(0, s.slices_used - slices))
        out.append(s)
    return out


def choose_victims(states: Sequence[CardState], holdings: Mapping[str, Holding], proposed: Sequence[str],
                   req: SliceRequest, annotations: Mapping[str, str], default_gpu_policy: str = "spread",
                   ahead: Sequence[Ahead] = ()) -> Choice:
    """The proposal, or nothing, for one node; see the module docstring. Two fits and a check per card.

    `holdings`: the node's reservations by pod uid; `proposed`: kube-scheduler's victims (uids) on the node.
    Victims that hold no card there are part of the proposal like the others (kube-scheduler's own reasons).
    `ahead`: pods nominated here by earlier preemptions, placed first (plan_ahead), as kube-scheduler's dry run
    counts them: the victims must leave the preemptor a card besides theirs, or they would go for nothing."""
    if fit(plan_ahead(states, holdings, ahead, default_gpu_policy)[0], req, annotations, default_gpu_policy).ok:
        return Choice(UNCHANGED, tuple(proposed))
    after = plan_ahead(_without(states, [holdings[u] for u in proposed if u in holdings]), holdings, ahead,
                       default_gpu_policy, gone=set(proposed))[0]
    freed = fit(after, req, annotations, default_gpu_policy)
    if freed.ok:
        return Choice(KEPT, tuple(proposed), freed.cards)
    mutex = "mutex" in policy_of(annotations, GPU_POLICY, default_gpu_policy)
    why = [f"card {s.card.index}: {r}" for s in after if (r := card_rejection(s, req, annotations, mutex))]
    return Choice(NO_CARD, reason="; ".join(why) or f"fewer than {req.cards} cards of one model would be free")
