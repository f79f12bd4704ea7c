"""Card-knob rules no other test pinned down (red team, mutants): each case names the small bug in
shared/domain/knobs.py it guards against, and fails with that bug in place."""

from __future__ import annotations

import pytest

from shared.domain.knobs import ANNOTATION, KnobError, decode_annotation
from shared.domain.node import ANNOTATION_MISMATCH, node_inventory
from tests.unit._k8s import cfg, node

ALL = '"max_inst":4,"overcommit_ratio":100,"policy":0,"time_slice":1'


# mutant: a card's knobs are read when they hold at least the four known fields, not exactly them (a field of a
# newer format would be half-read, where the rule is to refuse a field the scheduler does not know)
def test_a_card_with_a_knob_this_scheduler_does_not_know_is_refused() -> None:
    assert decode_annotation('{"v":1,"cards":{"0":{' + ALL + '}}}').cards[0].max_inst == 4
    with pytest.raises(KnobError, match="card 0 must have exactly max_inst, policy, time_slice"):
        decode_annotation('{"v":1,"cards":{"0":{' + ALL + ',"boost":1}}}')
    inv = node_inventory(node("n1", 32, 192, annotations={ANNOTATION: '{"v":1,"cards":{"0":{' + ALL
                                                          + ',"boost":1}}}'}), cfg((96,)))
    assert inv.cards == () and inv.problem == ANNOTATION_MISMATCH
