"""Which feasible nodes the filter returns: the best k by the node policy (pure).

kube-scheduler drops a node the extender's filter leaves out of both NodeNames and FailedNodes without a
status (pkg/scheduler/schedule_one.go findNodesThatPassExtenders: `feasibleNodes = feasibleList`), so a node
not in the top k is simply not a candidate: it is not reported as failed, and it can never appear in a
"0/N nodes are available" message, because that message is only made when no node is feasible (then k
drops nothing). With one node left kube-scheduler skips scoring (and our prioritize) altogether.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Sequence


def order_key(fill: float, name: str, policy: str) -> tuple[float, str]:
    """Where a node of this fill stands, ascending = best first: binpack fullest first, spread emptiest
    first, ties by node name. The one order both `ranked` and the extender's standing ranking
    (controller/ranking.py) follow."""
    return (fill if policy == "spread" else -fill, name)


def ranked(fills: Sequence[tuple[str, float]], policy: str) -> Iterator[str]:
    """The names of (node, fill) pairs, best first by the node policy, produced lazily.

    `fill` is the node's card fill (shared.domain.fit.node_score). binpack: fullest first; spread:
    emptiest first; ties by node name, so equal nodes are filled in name order. The filter fits nodes in
    this order and stops at the k-th that fits: the same nodes as `top_k` over every fitting node, at the
    cost of fitting (and ordering: a heap, O(n) to build, O(log n) per node taken) only until k are found.
    """
    heap = [order_key(f, n, policy) for n, f in fills]
    heapq.heapify(heap)
    while heap:
        yield heapq.heappop(heap)[1]


def top_k(fills: Sequence[tuple[str, float]], k: int, policy: str) -> list[str]:
    """The names of the best `k` of (node, fill) pairs, best first; `k` <= 0 keeps all in their order.
    The rule the filter's early stop must equal (tests/unit/test_topk.py checks the two agree)."""
    if k <= 0:
        return [n for n, _ in fills]
    return list(itertools.islice(ranked(fills, policy), k))
