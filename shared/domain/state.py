"""Plain data for the shared card state, as the ledger scripts return it and mirrors hold it.

A NodeSnapshot never changes: a change to a node is a new snapshot, and every snapshot made in this
process gets the next `seq` (one counter), so (node, seq) names one state of the node. Caches derived from
a snapshot (the extender's fit memo) are keyed by it; nothing depends on object identity.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from shared.domain.fit import GPU_POLICY, CardState, FitResult, Plan, fill_of, need_for, plan_booking, policy_of
from shared.domain.knobs import CardKnobs
from shared.domain.node import Card
from shared.domain.request import SliceRequest

_SEQ = itertools.count(1)


@dataclass(frozen=True)
class CardRecord:
    index: int
    capacity: int
    mem_used: int
    mem_free: int
    cores: int
    cores_used: int
    cores_free: int
    slices: int
    slice_limit: int
    health: str  # ok | cordoned | unhealthy | removed
    # the node agent's knobs (shared/domain/knobs.py), for display; None when the node publishes none
    policy: int | None = None
    time_slice: int | None = None
    overcommit_ratio: int | None = None

    @classmethod
    def from_json(cls, index: int, d: Mapping[str, Any]) -> CardRecord:
        def opt(key: str) -> int | None:
            v = d.get(key)
            return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

        return cls(index, int(d["capacity"]), int(d["mem_used"]), int(d["mem_free"]), int(d["cores"]),
                   int(d["cores_used"]), int(d["cores_free"]), int(d["slices"]), int(d["slice_limit"]),
                   str(d["health"]), opt("policy"), opt("time_slice"), opt("overcommit_ratio"))

    @property
    def knobs(self) -> CardKnobs | None:
        """The card's knobs as the agent published them (max_inst is the slice limit), or None."""
        if self.policy is None or self.time_slice is None or self.overcommit_ratio is None:
            return None
        return CardKnobs(self.slice_limit, self.policy, self.time_slice, self.overcommit_ratio)


@dataclass(frozen=True)
class Reservation:
    uid: str
    cards: tuple[int, ...]
    mem: int
    cores: int
    slices: int
    state: str  # pending | bound
    created: int  # ms (Redis clock)
    bound_at: int = 0
    pod: str = ""
    # until when (ms, Redis's clock) a bind attempt's Binding may still be committed (reserve.lua's hold_ms);
    # 0: none asked. Only scripts act on it, and a feed message does not bring a later attempt's stamp
    settle_by: int = 0

    @classmethod
    def from_json(cls, uid: str, d: Mapping[str, Any]) -> Reservation:
        cards = tuple(int(x) for x in str(d.get("cards") or "").split(",") if x)
        return cls(uid, cards, int(d["mem"]), int(d["cores"]), int(d["slices"]), str(d["state"]),
                   int(d.get("created") or 0), int(d.get("bound_at") or 0), str(d.get("pod") or ""),
                   int(d.get("settle_by") or 0))


@dataclass(frozen=True)
class NodeSnapshot:
    node: str
    version: int  # the ledger's version of the node (the feed's order; starts over when its keys are new)
    error: str = ""
    cards: Mapping[int, CardRecord] = field(default_factory=dict)  # never edited: a change is a new snapshot
    reservations: Mapping[str, Reservation] = field(default_factory=dict)
    # when the ledger's last write of the node happened (Redis's clock): with `version` it names that write
    # (the keys' `stamp`; "" when not known, e.g. a node written before stamps existed)
    stamp: str = ""
    # False when Redis's process changed (a restart, a failover) since the watchers last compared the node with
    # the API server: the reserve script books nothing there until they do (snapshot.lua; feed messages do not
    # carry it, so only a snapshot read says so). Part of the value: a re-read that differs only in it replaces a
    # mirror's snapshot, and the reconciler's reuse of the mirror's decoding (Reconciler._read) cannot hide it.
    verified: bool = True
    # Not verified: when its keep window began (ms, Redis's clock; 0 when no writer has compared it under this
    # history yet). Only a read of the API begun a keep window after this may verify it (_lib.lua verify_after).
    unverified_since: int = 0
    # This process's version of the value: the next number of one counter for every snapshot made (also by
    # dataclasses.replace), so monotonic per node in a mirror. Not part of the value (compare/repr).
    seq: int = field(default_factory=lambda: next(_SEQ), init=False, compare=False, repr=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> NodeSnapshot:
        cards = d.get("cards") or {}
        res = d.get("res") or {}
        return cls(
            node=str(d["node"]), version=int(d.get("version") or 0), error=str(d.get("error") or ""),
            stamp=str(d.get("stamp") or ""), verified=d.get("verified", True) is not False,
            unverified_since=int(d.get("unverified_since") or 0),
            cards={int(k): CardRecord.from_json(int(k), v)
                   for k, v in (cards.items() if isinstance(cards, dict) else [])},
            reservations={k: Reservation.from_json(k, v)
                          for k, v in (res.items() if isinstance(res, dict) else [])},
        )

    def card_states(self) -> list[CardState]:
        """Fit input: usable cards (removed ones are not offered) with their usage."""
        return list(self.states())

    def states(self) -> tuple[CardState, ...]:
        """card_states() as a tuple, built once per snapshot (the extender filters hundreds of nodes per
        call, and most of them did not change since the previous pod)."""
        return self._states

    @cached_property
    def capacities(self) -> frozenset[int]:
        """Per-card capacities of its cards that are not removed (the webhook's mixed-fleet input)."""
        return frozenset(c.capacity for c in self.cards.values() if c.health != "removed")

    @cached_property
    def fill(self) -> float:
        """node_score of its cards, once per snapshot: the node policy's order for the top-k filter (it does
        not depend on the pod, so it is the same for every pod until the node changes). From the records'
        totals: the ranking needs every node's fill, and building every node's CardStates for it kept two
        more objects per card (a Card and a CardState) for the garbage collector to walk (80,000 at 5,000
        nodes); a node gets them only once a filter fits it. tests/unit/test_ranking.py: equal to
        node_score(states())."""
        usable = [c for c in self.cards.values() if c.health != "removed"]
        if not usable:
            return 0.0
        return fill_of(sum(min(c.slices, c.slice_limit) for c in usable), sum(c.slice_limit for c in usable),
                       sum(min(c.cores_used, c.cores) for c in usable), sum(c.cores for c in usable),
                       sum(min(c.mem_used, c.capacity) for c in usable), sum(c.capacity for c in usable))

    @cached_property
    def _states(self) -> tuple[CardState, ...]:
        out = []
        for c in sorted(self.cards.values(), key=lambda c: c.index):
            if c.health == "removed":
                continue
            card = Card(self.node, c.index, c.capacity, c.slice_limit, healthy=c.health in ("ok", "cordoned"),
                        cordoned=c.health == "cordoned", cores=c.cores, knobs=c.knobs)
            out.append(CardState(card, c.mem_used, c.cores_used, c.slices))
        return tuple(out)


def plan_on(snap: NodeSnapshot, uid: str, req: SliceRequest, annotations: Mapping[str, str], gpu_policy: str,
            fitted: FitResult | None = None) -> Plan:
    """What to send for pod `uid` on this node state (pure). A node that already holds the pod's booking
    gets its cards again with what this request books on them (the script answers a repeated reserve with
    that booking, whatever a new fit says, and refuses one for other amounts); otherwise plan_booking,
    reusing `fitted` (a fit of this request on this very snapshot) when given."""
    existing = snap.reservations.get(uid)
    if existing is not None and existing.cards:
        record = snap.cards.get(existing.cards[0])
        capacity = record.capacity if record is not None else 0
        mutex = "mutex" in policy_of(annotations, GPU_POLICY, gpu_policy)
        need = need_for(req, capacity, mutex)
        if req.whole_cards:  # the whole card as it was when booked (a capacity reported since does not count)
            need = replace(need, memory=existing.mem)
        return Plan(existing.cards, capacity, need)
    return plan_booking(snap.states(), req, annotations, gpu_policy, fitted)
