"""Placing a pod on a node: plan (pure, shared.domain.state.plan_on), send (Ledger.place), plan again on refusal.

One round trip when the caller's snapshot is current; each conflict costs one more (the script returns the
fresh state with its refusal, so no extra read is needed). Planning never weakens a check: the reserve
script applies the Lua twin of card_rule to the plan's cards atomically.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from shared.domain.fit import FitResult, Plan
from shared.domain.request import SliceRequest
from shared.domain.state import NodeSnapshot, plan_on
from shared.store.eviction import EVICTING
from shared.store.ledger import OTHER_AMOUNTS, TOO_MANY_ATTEMPTS, UNVERIFIED, Ledger, ReserveOutcome

log = logging.getLogger("mtsched.ledger")


async def place(ledger: Ledger, node: str, uid: str, req: SliceRequest, annotations: Mapping[str, str],
                snapshot: NodeSnapshot | None, gpu_policy: str, pod: str = "", max_attempts: int = 3,
                plan: Plan | None = None, hold_ms: int = 0) -> tuple[ReserveOutcome, FitResult | None]:
    """Book `req` for pod `uid` on `node` atomically; returns the outcome and the fit it came to.

    `snapshot`: the node as the caller knows it (None: read it). `plan`: one already made on `snapshot`
    (plan_on, e.g. from filter's memoized fit), sent as it is on the first attempt. `hold_ms`: Ledger.reserve's.
    """
    trips = 0
    result: FitResult | None = None
    outcome = ReserveOutcome(False)
    for attempt in range(1, max_attempts + 1):
        if snapshot is None:
            plan = None
            snapshot = await ledger.snapshot(node)
            trips += 1
            if snapshot is None:
                return ReserveOutcome(False, refused="node unregistered", attempts=attempt,
                                      round_trips=trips), None
        if snapshot.error:
            return ReserveOutcome(False, refused=f"node unregistered: {snapshot.error}", attempts=attempt,
                                  round_trips=trips), None
        if plan is None:
            plan = plan_on(snapshot, uid, req, annotations, gpu_policy)
        result = FitResult(plan.cards, plan.reasons)
        if not plan.ok:
            return ReserveOutcome(False, reasons=plan.reasons, attempts=attempt, round_trips=trips), result
        outcome, fresh = await ledger.place(node, uid, plan, pod=pod, hold_ms=hold_ms)
        trips += 1
        if outcome.ok:
            if outcome.cards != result.cards:  # booked earlier on other cards (our snapshot was stale)
                result = FitResult(outcome.cards)
            return ReserveOutcome(True, outcome.cards, existing=outcome.existing, attempts=attempt,
                                  round_trips=trips, capacity=outcome.capacity, feed=outcome.feed,
                                  settle_by=outcome.settle_by, bind_no=outcome.bind_no,
                                  attempt=outcome.attempt), result
        # no plan can help: until the watchers compare the node; while the uid holds a booking of another size;
        # while Redis may drop keys when full
        if outcome.refused.startswith((UNVERIFIED, OTHER_AMOUNTS, EVICTING, TOO_MANY_ATTEMPTS)):
            return ReserveOutcome(False, refused=outcome.refused, attempts=attempt, round_trips=trips), result
        log.debug("reserve conflict on %s for %s: %s (attempt %d)", node, uid, outcome.reason, attempt)
        snapshot, plan = fresh, None
    return ReserveOutcome(False, refused=f"conflict: {outcome.reason}", attempts=max_attempts,
                          round_trips=trips), result
