"""Correctness after a phase: over-committed cards (ledger and annotations), unannotated bindings,
ledger/annotation agreement, and why pods waited."""

from __future__ import annotations

import contextlib
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from bench.load.cluster import LedgerView, list_all, node_model

# how long the ledger check waits for every booking of the phase to be there and bound (confirmed); past it the
# check compares what it holds, and `ledger_settled` False fails the run (report.summarize, cli.failed)
SETTLE_SECONDS = 30.0


def packing(usage: dict[tuple[str, int], list[int]]) -> dict[str, int]:
    """How tightly the phase packed: nodes and cards holding at least one slice (binpack: fewer is tighter)."""
    used = [key for key, (m, k, s) in usage.items() if m or k or s]
    return {"nodes_used": len({n for n, _ in used}), "cards_used": len(used)}


async def check(kube: Any, ns: str, ledger: LedgerView | None, node_names: list[str], bound: int) -> dict[str, Any]:
    """Over-commit (ledger and annotations), unannotated bindings, ledger/annotation agreement."""
    from shared.domain.annotations import ALLOCATED, AnnotationError, usage_from_annotations

    pods = await list_all(kube, f"/api/v1/namespaces/{ns}/pods")
    usage: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0, 0])
    unannotated = bad = 0
    kinds: Counter[str] = Counter()
    for p in pods:
        if not (p.get("spec") or {}).get("nodeName"):
            kinds["pending"] += 1
            continue
        if ALLOCATED not in ((p.get("metadata") or {}).get("annotations") or {}):
            unannotated += 1
            continue
        try:
            u = usage_from_annotations(p)
        except AnnotationError:
            bad += 1
            continue
        if u is None:
            continue
        kinds[f"{len(u.cards)}card"] += 1
        for c in u.cards:
            acc = usage[(u.node, c)]
            acc[0] += u.memory
            acc[1] += u.cores
            acc[2] += u.slices
    over_ann = [f"{n}/{c}" for (n, c), (m, k, s) in usage.items() if m > node_model(n) or k > 16 or s > 16]
    out: dict[str, Any] = {"overcommitted_cards_annotations": len(over_ann), "unannotated_bound": unannotated,
                           "undecodable": bad, "pending": kinds.pop("pending", 0), "placed": dict(kinds),
                           **packing(usage)}
    # why pods waited: warning events by reason, with an example message each
    reasons: Counter[str] = Counter()
    examples: dict[str, str] = {}
    with contextlib.suppress(Exception):
        for e in await list_all(kube, f"/api/v1/namespaces/{ns}/events", fieldSelector="type=Warning"):
            reasons[e.get("reason") or "?"] += int(e.get("count") or 1)
            examples.setdefault(e.get("reason") or "?", str(e.get("message") or "")[:300])
    out["warnings"] = {r: {"count": n, "example": examples[r]} for r, n in reasons.most_common()}
    if ledger is not None:
        def settled(s: dict[str, Any]) -> bool:
            res = [r for x in s.values() for r in x.reservations.values()]
            return len(res) >= bound and all(r.state == "bound" for r in res)

        ok, snaps = await ledger.wait(node_names, settled, SETTLE_SECONDS)
        over_l = 0
        booked: dict[tuple[str, int], list[int]] = {}
        for node, snap in snaps.items():
            for idx, c in snap.cards.items():
                if c.mem_used > c.capacity or c.cores_used > c.cores or c.slices > c.slice_limit \
                        or c.mem_free < 0 or c.cores_free < 0:
                    over_l += 1
                booked[(node, idx)] = [c.mem_used, c.cores_used, c.slices]
        # every card either side books: a record on a card (or node) the ledger does not hold is a mismatch too
        # (an empty ledger, e.g. a wrong --key-prefix, is not a clean one)
        mismatch = sum(booked.get(key) != usage.get(key, [0, 0, 0]) for key in booked.keys() | usage.keys())
        out.update(overcommitted_cards_ledger=over_l, ledger_annotation_mismatches=mismatch, ledger_settled=ok)
    return out


async def leaked_reservations(ledger: LedgerView, node_names: Sequence[str], timeout: float) -> list[str]:
    """The reservations (uids) the ledger still holds on the nodes once every pod is deleted, after waiting up to
    `timeout` s for them to be released; a ledger that cannot be read raises (never an empty list)."""
    _, snaps = await ledger.wait(node_names, lambda s: not any(x.reservations for x in s.values()), timeout)
    return [u for x in snaps.values() for u in x.reservations]
