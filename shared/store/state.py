"""Plain data for the shared card state, as the ledger scripts return it and mirrors hold it."""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.domain.fit import CardState
from shared.domain.knobs import CardKnobs
from shared.domain.node import Card


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

    @classmethod
    def from_json(cls, uid: str, d: Mapping[str, Any]) -> Reservation:
        cards = tuple(int(x) for x in str(d.get("cards") or "").split(",") if x)
        return cls(uid, cards, int(d["mem"]), int(d["cores"]), int(d["slices"]), str(d["state"]),
                   int(d.get("created") or 0), int(d.get("bound_at") or 0), str(d.get("pod") or ""))


@dataclass
class NodeSnapshot:
    node: str
    version: int
    error: str = ""
    cards: dict[int, CardRecord] = field(default_factory=dict)
    reservations: dict[str, Reservation] = field(default_factory=dict)
    # card_states() memo: (node name, the CardRecord objects it was built from, the states). CardRecord is
    # frozen, so the same objects mean the same input; any change to `cards` (a new dict or a new record)
    # is seen by identity. Not part of the value (compare/repr).
    _states_memo: tuple[str, tuple[CardRecord, ...], tuple[CardState, ...]] | None = field(
        default=None, init=False, compare=False, repr=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> NodeSnapshot:
        cards = d.get("cards") or {}
        res = d.get("res") or {}
        return cls(
            node=str(d["node"]), version=int(d.get("version") or 0), error=str(d.get("error") or ""),
            cards={int(k): CardRecord.from_json(int(k), v)
                   for k, v in (cards.items() if isinstance(cards, dict) else [])},
            reservations={k: Reservation.from_json(k, v)
                          for k, v in (res.items() if isinstance(res, dict) else [])},
        )

    def card_states(self) -> list[CardState]:
        """Fit input: usable cards (removed ones are not offered) with their usage."""
        return list(self.states())

    def states(self) -> tuple[CardState, ...]:
        """card_states() as a tuple that stays the same object while the node's cards are unchanged.

        Built once per change of the cards (the extender filters hundreds of nodes per call, and most
        of them did not change since the previous pod), so callers may memoize on its identity.
        """
        records = tuple(self.cards.values())
        memo = self._states_memo
        if (memo is not None and memo[0] == self.node and len(memo[1]) == len(records)
                and all(map(operator.is_, memo[1], records))):
            return memo[2]
        out = []
        for c in sorted(records, key=lambda c: c.index):
            if c.health == "removed":
                continue
            card = Card(self.node, c.index, c.capacity, c.slice_limit, healthy=c.health in ("ok", "cordoned"),
                        cordoned=c.health == "cordoned", cores=c.cores, knobs=c.knobs)
            out.append(CardState(card, c.mem_used, c.cores_used, c.slices))
        states = tuple(out)
        self._states_memo = (self.node, records, states)
        return states
