"""Every node of the extender's mirror in the node policy's order, kept as the mirror changes.

The top-k filter fits candidates best first and stops at the k-th that fits (shared/domain/topk.py). Ordering
the candidates anew per call cost a lookup of each one's fill and a heap over them: with 5,000 candidates
(`percentageOfNodesToScore: 100` at 5,000 nodes) most of the filter's time. The order does not depend on the
pod, only on each node's fill, which changes when its snapshot does: so it is kept sorted here, one update
per mirror change, and a filter walks it from the best node, skipping what is not a candidate. Nodes with
bookings in flight (`held`) are placed by their fill with those applied and merged in.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator
from collections.abc import Set as AbstractSet

from controller.fit_memo import Held, Planned, held_states
from shared.domain.fit import node_score
from shared.domain.topk import order_key
from shared.store.mirror import Mirror

POLICIES = ("binpack", "spread")


class Ranking:
    def __init__(self, mirror: Mirror):
        self.mirror = mirror
        self._fill: dict[str, float] = {}  # node -> the fill it is sorted by
        self._order: dict[str, list[tuple[float, str]]] = {p: [] for p in POLICIES}  # ascending order_key
        mirror.on_change.append(self.changed)
        for node in list(mirror.nodes):
            self.changed(node)

    def changed(self, node: str) -> None:
        """The mirror's snapshot of `node` changed (or went): move it to where its fill puts it."""
        old = self._fill.pop(node, None)
        if old is not None:
            for p, keys in self._order.items():
                del keys[bisect_left(keys, order_key(old, node, p))]
        snap = self.mirror.nodes.get(node)
        if snap is not None:
            fill = snap.fill
            self._fill[node] = fill
            for p, keys in self._order.items():
                insort(keys, order_key(fill, node, p))

    def best_first(self, names: Iterable[str], policy: str, held: Held) -> Iterator[str]:
        """The candidates the mirror holds, best first by `policy` (spread, else binpack), lazily: the order
        of `ranked` over their fills, bookings in flight applied (tests/unit/test_ranking.py). `names` may
        be a set already (the filter's ExtenderArgs.candidates): then it is not copied."""
        want = names if isinstance(names, AbstractSet) else set(names)
        nodes = self.mirror.nodes
        moved = sorted(order_key(h.fill_on(nodes[n]) if isinstance(h := held[n], Planned)
                                 else node_score(held_states(nodes[n], h)), n, policy)
                       for n in held if n in want and n in nodes)
        keys = self._order["spread" if policy == "spread" else "binpack"]
        rest = (k for k in keys if k[1] in want and k[1] not in held)
        for _, name in heapq.merge(rest, moved):
            yield name

    def __len__(self) -> int:
        return len(self._fill)
