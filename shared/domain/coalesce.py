"""Per-key coalescing with a minimum interval between a key's turns (pure: the caller passes the time).

The node watcher's events go through it (controller/node_watch.py): handling one Node event costs CPU in
proportion to the node's cards, and a Node object can change as fast as anyone who may write it likes (a flapping
kubelet, a stolen kubelet identity patching its own status in a loop). Handled one by one, one such node took the
watcher's whole core and every other node's change waited behind it. Through this structure:

- a key offered while it is already pending keeps its place and holds only the newest value (the rest are
  superseded: `coalesced`);
- a key taken less than `min_interval` ago waits until then (`deferred`); a key not taken recently is ready at once,
  so the first change after a quiet spell has no added latency;
- of the ready keys, the one whose pending value arrived first goes first: a key that keeps changing keeps its one
  place in the line and cannot starve the others.

So each key is taken at most once per `min_interval` (twice when a deletion was superseded, see `Pending.gone`),
however often it is offered, and the cost of offering is O(log n).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Generic, TypeVar

V = TypeVar("V")


class Offered(Enum):
    READY = "ready"  # pending now, ready to be taken
    DEFERRED = "deferred"  # pending now, taken less than min_interval ago: waits until then
    COALESCED = "coalesced"  # was pending already: its older value superseded (it keeps its place)


@dataclass
class Pending(Generic[V]):
    key: str
    value: V  # the newest value offered
    seq: int  # arrival order of the key's first pending value (its place in the line)
    offered: int = 0  # the offer count (`Coalescer.offers`) when `value` was offered: what came before what
    deleted: bool = False  # whether `value` is a deletion
    # the newest deletion superseded by a later value (a Node deleted then created again, perhaps with a new uid):
    # the taker handles the deletion first, so what a deletion does (forget the node, its baselines) is not lost
    gone: V | None = None


class Coalescer(Generic[V]):
    def __init__(self, min_interval: float) -> None:
        self.min_interval = min_interval
        self.pending: dict[str, Pending[V]] = {}
        self._ready: list[tuple[int, str]] = []  # (seq, key): pending keys whose interval is over
        self._waiting: list[tuple[float, int, str]] = []  # (due, seq, key): pending keys taken recently
        self._taken: dict[str, float] = {}  # when each key was last taken (only the last min_interval matters)
        self._prune_at = 64
        self._seq = 0
        self.offers = 0  # values offered so far (a mark: `Pending.offered` below it came before it)

    def __len__(self) -> int:
        return len(self.pending)

    def offer(self, key: str, value: V, now: float, deleted: bool = False, not_before: float | None = None) -> Offered:
        """`value` is the key's newest state (`deleted`: a deletion); `not_before`: a key not pending waits until then
        at least (a change to try again later)."""
        self.offers += 1
        p = self.pending.get(key)
        if p is not None:
            if deleted:
                p.gone = None  # a deletion is the newest state: one superseded before it is moot
            elif p.deleted:
                p.gone = p.value  # created again after the pending deletion: that is handled first
            p.value, p.deleted, p.offered = value, deleted, self.offers
            return Offered.COALESCED
        self._seq += 1
        self.pending[key] = Pending(key, value, self._seq, deleted=deleted, offered=self.offers)
        due = max(self._taken.get(key, float("-inf")) + self.min_interval,
                  not_before if not_before is not None else float("-inf"))
        if due <= now:
            heapq.heappush(self._ready, (self._seq, key))
            return Offered.READY
        heapq.heappush(self._waiting, (due, self._seq, key))
        return Offered.DEFERRED

    def _promote(self, now: float) -> None:
        while self._waiting and self._waiting[0][0] <= now:
            _, seq, key = heapq.heappop(self._waiting)
            heapq.heappush(self._ready, (seq, key))

    def wait(self, now: float) -> float | None:
        """Seconds until a key is ready (0: one is now); None when nothing is pending."""
        if self._ready:
            return 0.0
        if self._waiting:
            return max(0.0, self._waiting[0][0] - now)
        return None

    def take(self, now: float) -> Pending[V] | None:
        """The ready key that arrived first, its newest value; None when no key is ready."""
        self._promote(now)
        while self._ready:
            seq, key = heapq.heappop(self._ready)
            p = self.pending.get(key)
            if p is None or p.seq != seq:
                continue  # (defensive: every pending key has exactly one entry, with its seq)
            del self.pending[key]
            self._taken[key] = now
            if len(self._taken) > self._prune_at:  # forget keys whose interval is over: bounded by the busy ones
                self._taken = {k: t for k, t in self._taken.items() if t + self.min_interval > now}
                self._prune_at = max(64, 2 * len(self._taken))
            return p
        return None

    def put_back(self, p: Pending[V], due: float | None = None) -> None:
        """`p`, taken, was not handled (the handler failed): pending again in its old place, ready at once (`due`:
        not before then), unless a newer value was offered meanwhile (that one is the key's state now; a deletion
        `p` held is kept with it)."""
        q = self.pending.get(p.key)
        if q is not None:
            if not q.deleted and q.gone is None:
                q.gone = p.value if p.deleted else p.gone
            return
        self.pending[p.key] = p
        if due is None:
            self._taken.pop(p.key, None)
            heapq.heappush(self._ready, (p.seq, p.key))
        else:
            heapq.heappush(self._waiting, (due, p.seq, p.key))

    def drop(self, stale: Callable[[Pending[V]], bool]) -> list[str]:
        """Drop the pending keys whose value is `stale` (a newer view of them was applied meanwhile); their keys.
        (Their places in the heaps are skipped when reached, as a key's outdated place is.)"""
        gone = [k for k, p in self.pending.items() if stale(p)]
        for k in gone:
            del self.pending[k]
        return gone

    def clear(self) -> None:
        """Drop every pending value (a re-list's view supersedes them); when keys were last taken is kept."""
        self.pending.clear()
        self._ready.clear()
        self._waiting.clear()
