"""Rules of card order, card score and policy reading that no other test pinned down (red team, mutants).

Each case names the small bug it guards against: with the bug in shared/domain/fit.py the case fails.
"""

from __future__ import annotations

from typing import Any

import pytest

from shared.domain import fit as F
from shared.domain.fit import CardState, card_order, extender_priority, fill_of, fit, node_score, share
from shared.domain.node import Card
from shared.domain.request import SliceRequest, pod_request
from shared.domain.topk import top_k
from tests.unit._k8s import cfg, pod, slice_ctr


def used(index: int, memory: int = 0, cores: int = 0, slices: int = 0, capacity: int = 96,
         **card: Any) -> CardState:
    return CardState(Card("n1", index, capacity, **card), memory, cores, slices)


def sl(memory: int, cores: int) -> SliceRequest:
    req = pod_request(pod(slice_ctr("a", memory, cores)), cfg((96,)))
    assert req is not None
    return req


# mutant: the card score reads the memory fill where the core fill belongs (cores not counted)
@pytest.mark.parametrize(("policy", "first"), [("spread", 0), ("binpack", 1)])
def test_the_card_score_counts_core_groups(policy: str, first: int) -> None:
    # same memory and slices on both cards; card 1 holds 12 core groups, card 0 one: they are not equal
    states = [used(0, memory=8, cores=1, slices=1), used(1, memory=8, cores=12, slices=1)]
    assert states[1].score() == pytest.approx(10 * (1 / 16 + 12 / 16 + 8 / 96))
    assert card_order(states, policy)[0].card.index == first
    assert fit(states, sl(8, 2), {}, policy).cards == (first,)


# mutant: share() of a total of 0 reads as empty (0) instead of full (1)
def test_a_card_with_no_total_reads_as_full() -> None:
    assert share(0, 0) == 1.0
    assert share(5, 0) == 1.0
    assert fill_of(0, 0, 0, 0, 0, 0) == pytest.approx(30.0)
    # a damaged card (no slice limit, as _lib.lua's `num` reads a damaged field) sorts as the fullest card
    damaged = used(1, max_slices=0)
    assert damaged.score() == pytest.approx(10.0)
    assert [s.card.index for s in card_order([used(0), damaged], "spread")] == [0, 1]
    assert node_score([damaged]) == pytest.approx(10.0)


# mutant: the card policy is read without lowering its case ("BINPACK" would fall back to spread, "MUTEX" to none)
@pytest.mark.parametrize(("annotation", "default", "chosen"), [
    ("BINPACK", "spread", (2,)),
    ("Binpack", "spread", (2,)),
    (" binPack ", "spread", (2,)),
    ("MUTEX", "binpack", (1,)),
])
def test_the_card_policy_is_case_insensitive(annotation: str, default: str, chosen: tuple[int, ...]) -> None:
    three = [used(0, memory=32, cores=4, slices=1), used(1), used(2, memory=64, cores=8, slices=2)]
    assert fit(three, sl(16, 4), {F.GPU_POLICY: annotation}, default).cards == chosen


def test_mutex_in_capitals_still_needs_an_idle_card() -> None:
    busy = [used(0, memory=2, cores=1, slices=1), used(1, memory=2, cores=1, slices=1)]
    got = fit(busy, sl(8, 2), {F.GPU_POLICY: "MUTEX"}, "spread")
    assert not got.ok and got.reasons.names() == (F.EXCLUSIVE_CONFLICT,)


# mutant: the priority treats only "binpack" as binpack; the ranking (topk.order_key) treats every policy but
# "spread" so: an unknown node policy (an annotation edited after admission) must rank and score alike
@pytest.mark.parametrize("policy", ["bogus", "binpack,spread", ""])
def test_a_node_policy_other_than_spread_scores_as_binpack(policy: str) -> None:
    busy = [used(0, memory=64, cores=8, slices=2), used(1)]
    assert extender_priority(busy, policy) == extender_priority(busy, "binpack") == 2
    assert extender_priority(busy, "spread") == 8
    assert top_k([("empty", 0.0), ("busy", node_score(busy))], 1, policy) == ["busy"]
