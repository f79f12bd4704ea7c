"""Which feasible nodes the filter returns: the best k by the node policy (pure).

kube-scheduler drops a node the extender's filter leaves out of both NodeNames and FailedNodes without a
status (pkg/scheduler/schedule_one.go findNodesThatPassExtenders: `feasibleNodes = feasibleList`), so a node
not in the top k is simply not a candidate: it is not reported as failed, and it can never appear in a
"0/N nodes are available" message, because that message is only made when no node is feasible (then k
drops nothing). With one node left kube-scheduler skips scoring (and our prioritize) altogether.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


def top_k(fills: Sequence[tuple[str, float]], k: int, policy: str) -> list[str]:
    """The names of the best `k` of (node, fill) pairs, best first; `k` <= 0 keeps all in their order.

    `fill` is the node's card fill (shared.domain.fit.node_score). binpack: fullest first; spread:
    emptiest first; ties by node name, so equal nodes are filled in name order.
    """
    if k <= 0:
        return [n for n, _ in fills]
    if policy == "spread":  # nsmallest: O(n log k), the filter runs it over every feasible node
        return [n for n, _ in heapq.nsmallest(k, fills, key=lambda nf: (nf[1], nf[0]))]
    return [n for n, _ in heapq.nsmallest(k, fills, key=lambda nf: (-nf[1], nf[0]))]
