"""Admission rules no other test pinned down (red team, mutants): each case names the small bug in
shared/domain/admission.py it guards against, and fails with that bug in place."""

from __future__ import annotations

import pytest

from shared.domain.admission import decide
from tests.unit._k8s import cfg, pod, slice_ctr

NODE_POLICY = "hami.io/node-scheduler-policy"
MIXED = cfg((96, 160))


# mutant: the node policy is split on commas like the card policy: "spread,binpack" would pass, and the extender,
# which reads any node policy but exactly "spread" as binpack, would pack a pod its creator asked to spread
@pytest.mark.parametrize("value", ["spread,binpack", "binpack,spread", "spread, spread"])
def test_a_node_policy_is_one_policy_not_a_list(value: str) -> None:
    d = decide(pod(slice_ctr(), annotations={NODE_POLICY: value}), MIXED, (96, 160))
    assert not d.allowed
    assert f"annotation {NODE_POLICY}={value!r} names no policy; allowed: binpack, spread" in d.message, d.message
