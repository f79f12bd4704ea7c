"""Card-aware preemption: which of the victims kube-scheduler proposes on a node free a card (pure).

kube-scheduler's dry run removes lower-priority pods until the preemptor fits the node's *totals*
(its own filter plugins; the extender is not asked). Those victims may sit on several cards and free
none of them enough. Here the proposal is reduced to the fewest victims (then the lowest priorities)
that free `req.cards` cards the preemptor fits on under the same per-card rule the filter applies
(`card_rejection`, i.e. `card_rule`), checked at the end by `fit` on the cards as they would be.
Victims that hold no card on the node (no reservation there) are kept: kube-scheduler proposed them
for a reason its own plugins judged (CPU, memory, pod count), which is not ours to overrule. Victims
on other cards are dropped. No card freed: the node is dropped (`Choice.victims` empty).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import combinations

from shared.domain.fit import GPU_POLICY, CardState, card_rejection, fit, policy_of
from shared.domain.request import SliceRequest

SUBSETS_PER_CARD = 4096  # subsets tried on one card before settling for the fewest found (else all its victims)
CARD_SETS = 1024  # sets of req.cards cards tried, cheapest cards first (C(40, 10) is 8e8: never all of them)
# card-rule checks of the searches in one preempt call, over all its nodes: kube-scheduler sends 100 candidate
# nodes or more, and 4096 subsets on each of 8 cards of each was ~30 s of the event loop filter and bind share
CHECKS_PER_CALL = 65_536

KEPT = "kept"  # the proposal frees a card as it is
REDUCED = "reduced"  # some proposed victims freed nothing the preemptor can use and were dropped
UNCHANGED = "unchanged"  # a card already fits: the cards do not block, kube-scheduler's choice stands
NO_CARD = "no_card"  # no card is freed by the proposed victims: the node is dropped


@dataclass(frozen=True)
class Victim:
    uid: str
    priority: int


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
    victims: tuple[str, ...] = ()  # uids to evict, in the proposal's order; empty: drop the node
    cards: tuple[int, ...] = ()  # the cards freed for the preemptor (empty when UNCHANGED or NO_CARD)
    reason: str = ""  # NO_CARD: why, per card


class Budget:
    """Card-rule checks left to one preempt call's searches (CHECKS_PER_CALL). Once spent, a card takes the
    fewest victims found so far, else all its proposed victims (they free it), and a node its first set of
    cards that fits: bounded work per call, however many nodes it carries."""

    def __init__(self, checks: int = CHECKS_PER_CALL) -> None:
        self.left = checks

    def spend(self, checks: int = 1) -> bool:
        """Take `checks`; False once the budget is spent."""
        self.left -= checks
        return self.left >= 0


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


def _cost(victims: Sequence[Victim]) -> tuple[int, int, int]:
    """Fewest victims, then the lowest highest priority, then the lowest sum (kube-scheduler's order too)."""
    prios = [v.priority for v in victims]
    return len(prios), max(prios, default=-(2**31)), sum(prios)


def _free_one(state: CardState, on_card: Sequence[Victim], holdings: Mapping[str, Holding],
              req: SliceRequest, annotations: Mapping[str, str], mutex: bool,
              budget: Budget) -> tuple[Victim, ...] | str:
    """The cheapest subset of `on_card` whose eviction lets the card take the request, or why none does."""
    def frees(subset: Sequence[Victim]) -> str:
        after = _without((state,), [holdings[v.uid] for v in subset])[0]
        return card_rejection(after, req, annotations, mutex)

    everyone = tuple(on_card)
    why = frees(everyone)
    if why:  # the rule is monotone in what is removed: if all of them do not free it, no subset does
        return why
    # monotone again: a victim without which the others do not free the card is in every subset that does
    # (an idle card for a whole-card pod needs all its holders: one check each, not 2^n subsets)
    required: list[Victim] = []
    optional: list[Victim] = []
    for v in everyone:
        if not budget.spend():
            return everyone
        (required if frees([u for u in everyone if u is not v]) else optional).append(v)
    tried = 0
    for k in range(len(optional) + 1):
        best: tuple[Victim, ...] | None = None
        for extra in combinations(optional, k):
            tried += 1
            if tried > SUBSETS_PER_CARD or not budget.spend():
                return best or everyone  # too many to search: the fewest found (none smaller frees it), else all
            subset = (*required, *extra)
            if not frees(subset) and (best is None or _cost(subset) < _cost(best)):
                best = subset
        if best is not None:
            return best
    return everyone


def choose_victims(states: Sequence[CardState], holdings: Mapping[str, Holding], proposed: Sequence[Victim],
                   req: SliceRequest, annotations: Mapping[str, str], default_gpu_policy: str = "spread",
                   budget: Budget | None = None) -> Choice:
    """What to evict on one node so the preemptor gets `req.cards` cards; see the module docstring.

    `holdings`: the node's reservations by pod uid; `proposed`: kube-scheduler's victims on the node;
    `budget`: the call's (one for all its nodes), else this node's own."""
    budget = budget if budget is not None else Budget()
    if fit(states, req, annotations, default_gpu_policy).ok:
        return Choice(UNCHANGED, tuple(v.uid for v in proposed))
    mutex = "mutex" in policy_of(annotations, GPU_POLICY, default_gpu_policy)
    holders = [v for v in proposed if v.uid in holdings]
    per_card: dict[int, tuple[Victim, ...]] = {}
    reasons: list[str] = []
    for s in states:
        on_card = [v for v in holders if s.card.index in holdings[v.uid].cards]
        got = _free_one(s, on_card, holdings, req, annotations, mutex, budget)
        if isinstance(got, str):
            reasons.append(f"card {s.card.index}: {got}")
        else:
            per_card[s.card.index] = got
    capacity = {s.card.index: s.card.capacity for s in states}
    best: tuple[tuple[int, int, int], tuple[int, ...], tuple[Victim, ...]] | None = None
    # cheapest cards first, so the first sets tried are the likely best; bounded (the event loop waits)
    by_cost = sorted(per_card, key=lambda i: (_cost(per_card[i]), i))
    for tried, chosen_cards in enumerate(combinations(by_cost, req.cards)):
        if tried >= CARD_SETS or (best is not None and budget.left <= 0):
            break
        cards = tuple(sorted(chosen_cards))
        if len({capacity[i] for i in cards}) > 1:
            continue  # the cards of one pod are of one model (plan_booking)
        chosen = {v.uid: v for i in cards for v in per_card[i]}  # a multi-card holder counts once
        gone = tuple(v for v in holders if v.uid in chosen)
        # the filter's own answer on the cards as they would be: the preemptor must fit there
        budget.spend(len(states))
        after = fit(_without(states, [holdings[v.uid] for v in gone]), req, annotations, default_gpu_policy)
        if not after.ok:
            continue
        key = (_cost(gone), cards, gone)
        if best is None or key[:2] < best[:2]:
            best = key
    if best is None:
        why = "; ".join(reasons) or f"fewer than {req.cards} cards could be freed"
        return Choice(NO_CARD, reason=why)
    _, cards, gone = best
    keep = {v.uid for v in gone} | {v.uid for v in proposed if v.uid not in holdings}
    victims = tuple(v.uid for v in proposed if v.uid in keep)
    if not victims:  # nothing to evict frees a card (cannot happen: the preemptor did not fit as things are)
        return Choice(NO_CARD, reason="no proposed victim holds a card")
    return Choice(KEPT if len(victims) == len(proposed) else REDUCED, victims, cards)
