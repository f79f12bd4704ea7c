"""Fitting a SliceRequest onto a node's cards, and scoring nodes: pure functions.

Reason names and the "N/M Reason" aggregation are HAMi's, so users' alerts and greps keep working. Reasons
travel as counts (`Reasons`); the "N/M Reason" text is made only where it leaves the process (the filter's
HTTP reply, bind errors, events).
Card order follows HAMi: cards are sorted by the card policy and the best candidate is tried
first (spread: least used; binpack: most used; ties: the highest index, as HAMi's backward scan).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache

from shared.domain.node import Card
from shared.domain.request import SliceRequest, card_accepts

USE_UUID = "mthreads.ai/use-gpuuuid"
NOUSE_UUID = "mthreads.ai/nouse-gpuuuid"
GPU_POLICY = "hami.io/gpu-scheduler-policy"
FIT_ANNOTATIONS = (USE_UUID, NOUSE_UUID, GPU_POLICY)  # all fit() reads of a pod's annotations
NODE_POLICY = "hami.io/node-scheduler-policy"
# HAMi's per-pod card score weights (slot, core, memory): not read here, cards are scored with equal weights
SCORING_WEIGHTS = "hami.io/device-scoring-weights"

CARD_NOT_HEALTH = "CardNotHealth"
CARD_CORDONED = "CardCordoned"
CARD_TYPE_MISMATCH = "CardTypeMismatch"
CARD_UUID_MISMATCH = "CardUuidMismatch"
CARD_SLICES_EXHAUSTED = "CardTimeSlicingExhausted"
EXCLUSIVE_CONFLICT = "ExclusiveDeviceAllocateConflict"
CARD_INSUFFICIENT_MEMORY = "CardInsufficientMemory"
CARD_INSUFFICIENT_CORE = "CardInsufficientCore"
CARD_COMPUTE_EXHAUSTED = "CardComputeUnitsExhausted"
NODE_INSUFFICIENT_DEVICE = "NodeInsufficientDevice"
ALLOCATED_INSUFFICIENT = "AllocatedCardsInsufficientRequest"


@dataclass(frozen=True)
class CardState:
    """A card with what is booked on it (units, core groups, slice instances)."""

    card: Card
    memory_used: int = 0
    cores_used: int = 0
    slices_used: int = 0

    @property
    def memory_free(self) -> int:
        return self.card.capacity - self.memory_used

    @property
    def cores_free(self) -> int:
        return self.card.cores - self.cores_used

    @property
    def idle(self) -> bool:
        return self.memory_used == 0 and self.cores_used == 0 and self.slices_used == 0

    def score(self) -> float:
        """HAMi's card score: slot + core + memory fill, each 0..10."""
        c = self.card
        return 10 * (share(self.slices_used, c.max_slices) + share(self.cores_used, c.cores)
                     + share(self.memory_used, c.capacity))

    def book(self, memory: int, cores: int, slices: int) -> CardState:
        return CardState(self.card, self.memory_used + memory, self.cores_used + cores,
                         self.slices_used + slices)


@dataclass(frozen=True)
class Reasons:
    """Why a node cannot take a request, as counts: reason name -> cards that gave it, of `total` cards
    (sorted by name, zero counts left out, so equal counts are equal values)."""

    counts: tuple[tuple[str, int], ...] = ()
    total: int = 0

    @classmethod
    def of(cls, counts: Mapping[str, int], total: int) -> Reasons:
        return cls(tuple(sorted((r, n) for r, n in counts.items() if n)), total)

    def names(self) -> tuple[str, ...]:
        return tuple(r for r, _ in self.counts)

    @cached_property
    def text(self) -> str:
        """HAMi's "N/M Reason, ..." (made once per value: memoized answers share their Reasons)."""
        return gen_reason(dict(self.counts), self.total)


NO_REASONS = Reasons()


@dataclass(frozen=True)
class FitResult:
    cards: tuple[int, ...] = ()  # chosen card indices; empty = no fit
    reasons: Reasons = NO_REASONS  # why not, when it does not fit

    @property
    def ok(self) -> bool:
        return bool(self.cards)

    @property
    def reason(self) -> str:
        """HAMi's text of `reasons` ("" when it fits)."""
        return self.reasons.text


def gen_reason(reasons: Mapping[str, int], total: int) -> str:
    """HAMi's GenReason: "N/M Reason" items, lexicographically sorted, joined by ", "."""
    return ", ".join(sorted(f"{n}/{total} {r}" for r, n in reasons.items() if n))


@lru_cache(maxsize=2)
def _id_list(raw: str | None) -> frozenset[str]:
    # parsed once per value, not once per node: fit runs per candidate node with the pod's annotation,
    # which can be 256 KiB (a filter over 2,000 nodes spent seconds splitting it in the event loop). Two
    # values (the pod's use- and nouse- lists) are kept: a pod's annotations are at most 256 KiB in all,
    # so what this holds is too (docs/install.md, Resource sizing)
    return frozenset(p.strip() for p in (raw or "").split(",") if p.strip())


def policy_of(annotations: Mapping[str, str], key: str, default: str) -> str:
    value = (annotations.get(key) or "").strip().lower()
    return value or default


def card_order(states: Sequence[CardState], policy: str) -> list[CardState]:
    """Candidates in the order they are tried."""
    if "binpack" in policy:
        return sorted(states, key=lambda s: (-s.score(), -s.card.index))
    return sorted(states, key=lambda s: (s.score(), -s.card.index))


CARD_NOT_FOUND = "CardNotFound"


@dataclass(frozen=True)
class CardNeed:
    """What one card must offer for a request: everything the card rule reads besides the card. The same
    fields travel to the reserve script (Ledger.reserve), which applies the Lua twin of `card_rule`
    (shared/store/lua/_lib.lua) atomically; tests/redis/test_fit_twin.py proves the two agree."""

    memory: int
    cores: int
    slices: int
    accepts: frozenset[int] | None = None  # card capacities (models) that may serve it; None = any
    deny: frozenset[int] = frozenset()  # card indices it may not use (use-/nouse-gpuuuid)
    require_idle: bool = False  # whole cards, or the `mutex` card policy: nothing else on the card


@dataclass(frozen=True)
class CardView:
    """A card as the rule reads it, from the Python state or, field for field, from a card hash."""

    index: int
    health: str  # ok | cordoned | unhealthy | removed
    capacity: int
    mem_used: int
    cores: int
    cores_used: int
    slices: int
    slice_limit: int


def card_rule(c: CardView | None, n: CardNeed) -> str:
    """Why card `c` cannot take `n`; "" if it can. One order, one set of HAMi's reason names; the Lua
    twin is `card_rule` in shared/store/lua/_lib.lua (change both, the twin table must still pass)."""
    if c is None or c.health == "removed":
        return CARD_NOT_FOUND
    if c.health == "unhealthy":
        return CARD_NOT_HEALTH
    if c.health == "cordoned":
        return CARD_CORDONED
    if c.health != "ok":  # a value nothing of ours writes: not a card to book (as the Lua twin answers)
        return CARD_NOT_HEALTH
    if n.accepts is not None and c.capacity not in n.accepts:
        return CARD_TYPE_MISMATCH
    if c.index in n.deny:
        return CARD_UUID_MISMATCH
    if c.slices + n.slices > c.slice_limit:
        return CARD_SLICES_EXHAUSTED
    if n.require_idle and (c.mem_used > 0 or c.cores_used > 0 or c.slices > 0):
        return EXCLUSIVE_CONFLICT
    if max(0, c.capacity - c.mem_used) < n.memory:
        return CARD_INSUFFICIENT_MEMORY
    if n.cores == 0 and max(0, c.cores - c.cores_used) <= 0:
        return CARD_COMPUTE_EXHAUSTED  # HAMi: a 0-core ask may not land on a card with no core group left
    if max(0, c.cores - c.cores_used) < n.cores:
        return CARD_INSUFFICIENT_CORE
    return ""


def view_of(state: CardState) -> CardView:
    card = state.card
    return CardView(card.index, card.health, card.capacity, state.memory_used, card.cores, state.cores_used,
                    state.slices_used, card.max_slices)


def accepted_capacities(req: SliceRequest, capacities: Iterable[int]) -> frozenset[int]:
    """Of the card models present, those that can serve the request (card_accepts)."""
    return frozenset(c for c in capacities if card_accepts(c, req))


def denied_cards(states: Sequence[CardState], annotations: Mapping[str, str]) -> frozenset[int]:
    """Cards the pod's use-/nouse-gpuuuid annotations keep it off."""
    raw_use = annotations.get(USE_UUID)
    use, nouse = _id_list(raw_use), _id_list(annotations.get(NOUSE_UUID))
    # a use- list that is not blank but names no id (",,") selects no card, as HAMi reads it (an empty one: no
    # constraint); admission refuses it on new pods (selection_problems), an edit after is read the same way
    picky = bool(use) or bool((raw_use or "").strip())
    return frozenset(s.card.index for s in states if (picky and s.card.id not in use) or s.card.id in nouse)


def selection_problems(annotations: Mapping[str, object]) -> list[str]:
    """A use-gpuuuid list that names no card id (only commas and blanks): it selects no card, so the pod
    could never be placed."""
    raw = annotations.get(USE_UUID)
    if isinstance(raw, str) and raw.strip() and not _id_list(raw):
        return [f"annotation {USE_UUID}={raw[:64]!r} names no card id, so no card may take the pod; allowed: a "
                "comma list of device ids (<node>-mthreads-<index>), or no annotation for any card"]
    return []


def need_for(req: SliceRequest, capacity: int, mutex: bool, accepts: frozenset[int] | None = None,
             deny: frozenset[int] = frozenset()) -> CardNeed:
    """The CardNeed of one card of `capacity` units for `req` (whole cards book the whole card)."""
    memory, cores, slices = req.booking_for(capacity)
    return CardNeed(memory, cores, slices, accepts, deny, mutex or req.whole_cards)


def card_rejection(state: CardState, req: SliceRequest, annotations: Mapping[str, str], mutex: bool) -> str:
    """Why this card cannot take one card's worth of the request; "" if it can (card_rule)."""
    card = state.card
    need = need_for(req, card.capacity, mutex, accepted_capacities(req, (card.capacity,)),
                    denied_cards((state,), annotations))
    return card_rule(view_of(state), need)


def fit(states: Sequence[CardState], req: SliceRequest, annotations: Mapping[str, str],
        default_gpu_policy: str = "spread") -> FitResult:
    """Choose `req.cards` cards on one node, or say why not."""
    total = len(states)
    if req.cards > total:
        return FitResult(reasons=Reasons.of({NODE_INSUFFICIENT_DEVICE: 1}, 1))
    policy = policy_of(annotations, GPU_POLICY, default_gpu_policy)
    mutex = "mutex" in policy
    reasons: Counter[str] = Counter()
    chosen: list[int] = []
    for state in card_order(states, policy):
        why = card_rejection(state, req, annotations, mutex)
        if why:
            reasons[why] += 1
            continue
        chosen.append(state.card.index)
        if len(chosen) == req.cards:
            return FitResult(tuple(sorted(chosen)))
    if chosen:
        reasons[ALLOCATED_INSUFFICIENT] = len(chosen)
    return FitResult(reasons=Reasons.of(reasons, total))


@dataclass(frozen=True)
class Plan:
    """A booking to send: the cards, their capacity (each card's units, what the grants are cut from) and
    what each must offer and books (the reserve script checks the same `need` with the Lua twin of
    card_rule, atomically). No cards: it does not fit, and `reasons` say why."""

    cards: tuple[int, ...] = ()
    capacity: int = 0
    need: CardNeed | None = None
    reasons: Reasons = NO_REASONS

    @property
    def ok(self) -> bool:
        return bool(self.cards) and self.need is not None

    @property
    def reason(self) -> str:
        return self.reasons.text


def plan_booking(states: Sequence[CardState], req: SliceRequest, annotations: Mapping[str, str],
                 default_gpu_policy: str = "spread", fitted: FitResult | None = None) -> Plan:
    """Fit (or take `fitted`, a fit of the same request on these same states, e.g. filter's memoized
    one), then the CardNeed the atomic step must check: everything the card rule needs, policies
    included (`mutex` travels as require_idle), so no rule is checked only outside the script."""
    result = fitted if fitted is not None else fit(states, req, annotations, default_gpu_policy)
    if not result.ok:
        return Plan(reasons=result.reasons)
    by_index = {s.card.index: s for s in states}
    capacity = by_index[result.cards[0]].card.capacity
    mutex = "mutex" in policy_of(annotations, GPU_POLICY, default_gpu_policy)
    accepts = (frozenset({capacity}) if req.whole_cards
               else accepted_capacities(req, {s.card.capacity for s in states}))
    return Plan(result.cards, capacity, need_for(req, capacity, mutex, accepts, denied_cards(states, annotations)))


def apply(states: Sequence[CardState], req: SliceRequest, chosen: Sequence[int]) -> list[CardState]:
    """States after booking `req` on `chosen` cards."""
    out = []
    for s in states:
        if s.card.index in chosen:
            s = s.book(*req.booking_for(s.card.capacity))
        out.append(s)
    return out


def node_score(states: Sequence[CardState]) -> float:
    """HAMi's ComputeDefaultScore: 10 x (slot + core + memory fill over the node's cards), 0..30."""
    if not states:
        return 0.0
    # each card counts at most full (share): an over-full one must not make the node look fuller than it is
    return fill_of(sum(min(s.slices_used, s.card.max_slices) for s in states), sum(s.card.max_slices for s in states),
                   sum(min(s.cores_used, s.card.cores) for s in states), sum(s.card.cores for s in states),
                   sum(min(s.memory_used, s.card.capacity) for s in states), sum(s.card.capacity for s in states))


def fill_of(slices_used: int, slots: int, cores_used: int, cores: int, memory_used: int, memory: int) -> float:
    """node_score from a node's totals (what is booked, what its cards have), for callers that hold the
    totals without CardStates (NodeSnapshot.fill: every node's, without building a CardState per card)."""
    return 10 * (share(slices_used, slots) + share(cores_used, cores) + share(memory_used, memory))


def share(used: int, total: int) -> float:
    """used / total, at most 1 (full); 1 when there is no total: a card the ledger reads as damaged (_lib.lua `num`
    reads a damaged field as 0, so the scripts go on and refuse it) has no room, and must not stop a mirror's
    listener or a fit with a division by zero. A card over-full (its slice limit lowered below the slices it holds:
    maxSlicesPerCard, mtsched.io/max-inst, max_inst; a record the API server holds over its capacity) counts as
    full: more took the prioritize verb outside the extender API's 0..10 (16, or -6 under spread)."""
    return min(1.0, used / total) if total > 0 else 1.0


def extender_priority(states: Sequence[CardState], policy: str) -> int:
    """0..10 for the extender's prioritize verb: binpack prefers fuller nodes, spread emptier ones."""
    fill = round(node_score(states) / 3)
    return fill if policy != "spread" else 10 - fill


def failure_names(why: Reasons | str) -> tuple[str, ...]:
    """The reason names of one node's failure: its card reasons, or its one node-level reason."""
    return (why,) if isinstance(why, str) else why.names()


def aggregate_failures(failed: Mapping[str, Reasons | str]) -> list[str]:
    """HAMi's FilteringFailed event texts: "N nodes Reason(n1,n2)" per reason type, sorted. A node maps to
    its card reasons (counts) or to one node-level reason (e.g. "node unregistered")."""
    by_reason: dict[str, list[str]] = {}
    for node, why in failed.items():
        for name in failure_names(why):
            by_reason.setdefault(name, []).append(node)
    return [f"{len(nodes)} nodes {r}({','.join(sorted(nodes))})" for r, nodes in sorted(by_reason.items())]
