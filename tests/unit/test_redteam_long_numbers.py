"""Red team: a Node annotation with a number of more than 4300 digits.

Python refuses to convert a decimal string of more than 4300 digits to an int with a plain ValueError
(sys.int_max_str_digits), which is not the KnobError node_inventory catches. A Node annotation
`mtsched.io/max-inst` or `mtsched.io/card-knobs` holding such a number (written by anyone who may patch
the Node: its kubelet, its node agent) made `node_inventory` raise. The node watcher's handler, its
re-list and the reconciler's rebuild call it for every node: every watcher replica failed on that one
node, again at each replay, and gave up (no releases, no repairs, no rebuild), where docs/rules.md
promises that a malformed annotation closes the node, with the reason.
"""

from __future__ import annotations

from typing import Any

import pytest

from shared.domain.knobs import ANNOTATION as KNOBS_ANNOTATION
from shared.domain.knobs import KnobError, decode_annotation
from shared.domain.node import MAX_INST_ANNOTATION, node_inventory
from tests.unit._k8s import cfg, node

HUGE = "1" * 5000  # more digits than int() converts (4300)


def knobs(max_inst: str = "16", v: str = "1") -> str:
    return (f'{{"cards":{{"0":{{"max_inst":{max_inst},"overcommit_ratio":100,"policy":0,"time_slice":1}}}},'
            f'"v":{v}}}')


def annotated(key: str, value: str) -> dict[str, Any]:
    n = node("n1", cores=32, memory=192)
    n["metadata"]["annotations"] = {key: value}
    return n


@pytest.mark.parametrize(("key", "value"), [
    (MAX_INST_ANNOTATION, HUGE),
    (KNOBS_ANNOTATION, knobs(max_inst=HUGE)),
    (KNOBS_ANNOTATION, knobs(v=HUGE)),
], ids=["max-inst", "knob-value", "knob-version"])
def test_redteam_a_node_annotation_with_a_huge_number_closes_the_node(key: str, value: str) -> None:
    inv = node_inventory(annotated(key, value), cfg((96,)))  # raised ValueError before
    assert inv.error and not inv.cards
    assert key in inv.error


def test_redteam_knobs_with_a_huge_number_are_a_knob_error() -> None:
    with pytest.raises(KnobError, match="max_inst"):
        decode_annotation(knobs(max_inst=HUGE))
