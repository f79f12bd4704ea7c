"""Red team, configuration changes: `maxSlicesPerCard` (or a node's `mtsched.io/max-inst`, or a card's published
`max_inst`) lowered below the slices a card already holds leaves that card over-full: its holders keep their
slices, and the ledger says `slices` 16 of `slice_limit` 2. The prioritize verb then answered outside the
extender API's 0..10 (`MaxExtenderPriority`; docs/rules.md: "turned into the extender's 0..10 priority"): 16 under
binpack, -6 under spread, which kube-scheduler multiplies by 10 and adds to its plugins' 0..100 scores, so one
over-full card outweighed every other plugin (binpack) or pushed its node below the ones that do not fit as well
(spread). A card's fill counts at most full."""

from __future__ import annotations

import pytest

from shared.domain.fit import CardState, extender_priority, node_score
from shared.domain.node import Card
from shared.domain.state import CardRecord, NodeSnapshot


def overfull() -> list[CardState]:
    # 16 slices of 2 units and 1 core each on card 0, booked under maxSlicesPerCard 16, now 2; card 1 empty
    return [CardState(Card("n", 0, 96, 2), 32, 16, 16), CardState(Card("n", 1, 96, 2))]


@pytest.mark.parametrize("policy", ["binpack", "spread"])
def test_redteam_cfg_priority_stays_within_the_extender_range_on_an_overfull_card(policy: str) -> None:
    got = extender_priority(overfull(), policy)
    assert 0 <= got <= 10, f"{policy}: priority {got} outside the extender API's 0..10"


def test_redteam_cfg_node_score_counts_an_overfull_card_as_full() -> None:
    states = overfull()
    assert node_score(states) == node_score([CardState(Card("n", 0, 96, 2), 32, 16, 2), states[1]])
    assert all(0 <= s.score() <= 30 for s in states)


def test_redteam_cfg_the_rankings_fill_agrees() -> None:
    cards = {0: CardRecord(0, 96, 32, 64, 16, 16, 0, 16, 2, "ok"), 1: CardRecord(1, 96, 0, 96, 16, 0, 16, 0, 2, "ok")}
    snap = NodeSnapshot("n", 1, "", cards, {})
    assert snap.fill == node_score(overfull()) <= 30
