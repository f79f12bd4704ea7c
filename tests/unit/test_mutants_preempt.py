"""Preemption rules no other test pinned down (red team, mutants): each case names the small bug in
shared/domain/preempt.py it guards against, and fails with that bug in place."""

from __future__ import annotations

from shared.domain.fit import GPU_POLICY
from shared.domain.preempt import NO_CARD, Ahead, choose_victims
from tests.unit.test_preempt import node, sl


# mutant: choose_victims plans the nominated pods without telling plan_ahead which pods it already took out
# (`gone`): a victim of both is subtracted twice, and the card its neighbour still holds reads emptier than it is
def test_a_victim_of_both_the_preemptor_and_a_nominated_pod_is_taken_out_once() -> None:
    # card 0: v (32 units, both pods' victim) and w (64 units, stays); card 1 idle. p1 (nominated, binpack) needs
    # 64: with v gone card 0 has 32 free, so p1 goes to card 1 and the preemptor (64) has no card: NO_CARD.
    # v taken out twice, card 0 would read 64 free: p1 planned there, card 1 "free" for the preemptor (KEPT), and
    # v evicted for nothing
    states, holdings = node([("v", (0,), 32, 4, 1), ("w", (0,), 64, 8, 9999)])
    nominated = Ahead("p1", 1000, sl(64), {GPU_POLICY: "binpack"}, ("v",))
    got = choose_victims(states, holdings, ["v"], sl(64), {}, "spread", [nominated])
    assert got.outcome == NO_CARD and got.victims == ()
    assert "card 0: CardInsufficientMemory" in got.reason
