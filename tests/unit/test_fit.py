"""Per-card fit, reasons, card order and node scores (reference §5.3-5.4, §9, HAMi TestDevices_Fit)."""

from __future__ import annotations

from typing import Any

import pytest

from shared.domain import fit as F
from shared.domain.fit import (
    CardState,
    aggregate_failures,
    apply,
    card_order,
    extender_priority,
    fit,
    gen_reason,
    node_score,
)
from shared.domain.node import Card, node_inventory
from shared.domain.request import PIN_ANNOTATION, ContainerShare, Mode, SliceRequest, pod_request
from tests.unit._k8s import VGPU, cards, cfg, ctr, node, pod, slice_ctr

MIXED = cfg((96, 160))


def sl(memory: int, cores: int, c: Any = MIXED) -> SliceRequest:
    req = pod_request(pod(slice_ctr("a", memory, cores)), c)
    assert req is not None
    return req


def whole(n: int = 1, annotations: dict[str, str] | None = None) -> SliceRequest:
    req = pod_request(pod(ctr("a", limits={VGPU: n}), annotations=annotations), MIXED)
    assert req is not None and req.whole_cards
    return req


def used(
    index: int, memory: int = 0, cores: int = 0, slices: int = 0, capacity: int = 96, **card: Any
) -> CardState:
    return CardState(Card("n1", index, capacity, **card), memory, cores, slices)


def test_reason_strings_are_hamis() -> None:
    # Users grep these (reference §5.4 / common.go).
    assert {
        F.CARD_NOT_HEALTH,
        F.CARD_CORDONED,
        F.CARD_TYPE_MISMATCH,
        F.CARD_UUID_MISMATCH,
        F.CARD_SLICES_EXHAUSTED,
        F.EXCLUSIVE_CONFLICT,
        F.CARD_INSUFFICIENT_MEMORY,
        F.CARD_INSUFFICIENT_CORE,
        F.CARD_COMPUTE_EXHAUSTED,
        F.NODE_INSUFFICIENT_DEVICE,
        F.ALLOCATED_INSUFFICIENT,
    } == {
        "CardNotHealth",
        "CardCordoned",
        "CardTypeMismatch",
        "CardUuidMismatch",
        "CardTimeSlicingExhausted",
        "ExclusiveDeviceAllocateConflict",
        "CardInsufficientMemory",
        "CardInsufficientCore",
        "CardComputeUnitsExhausted",
        "NodeInsufficientDevice",
        "AllocatedCardsInsufficientRequest",
    }
    assert (F.USE_UUID, F.NOUSE_UUID) == ("mthreads.ai/use-gpuuuid", "mthreads.ai/nouse-gpuuuid")
    assert (F.GPU_POLICY, F.NODE_POLICY) == ("hami.io/gpu-scheduler-policy", "hami.io/node-scheduler-policy")


@pytest.mark.parametrize(
    ("reasons", "total", "text"),
    [
        (
            {"CardUuidMismatch": 1, "CardInsufficientMemory": 1},
            2,
            "1/2 CardInsufficientMemory, 1/2 CardUuidMismatch",
        ),  # the reference's example
        (
            {"CardNotHealth": 3, "CardInsufficientMemory": 3, "CardInsufficientCore": 2},
            8,
            "2/8 CardInsufficientCore, 3/8 CardInsufficientMemory, 3/8 CardNotHealth",
        ),
        # Go sort.Strings on the whole item: "10/12 ..." sorts before "2/12 ..."
        (
            {"CardUuidMismatch": 10, "CardInsufficientMemory": 2},
            12,
            "10/12 CardUuidMismatch, 2/12 CardInsufficientMemory",
        ),
        ({"CardNotHealth": 0, "CardCordoned": 1}, 1, "1/1 CardCordoned"),  # zero counts are not reasons
        ({}, 4, ""),
    ],
)
def test_gen_reason(reasons: dict[str, int], total: int, text: str) -> None:
    assert gen_reason(reasons, total) == text


# --- HAMi TestDevices_Fit, re-expressed on real 16-core, 96-unit cards ----------------------------


def test_fit_success_takes_the_highest_index_on_a_tie() -> None:
    # HAMi "fit success": two idle cards -> dev-1 (backward scan).
    assert fit(cards(96, 2), sl(32, 8), {}) == F.FitResult((1,))


@pytest.mark.parametrize(
    ("state", "req", "annotations", "reason"),
    [
        # "memory not enough": 80 of 96 units used, 32 asked
        (used(0, memory=80, cores=2, slices=1), sl(32, 2), {}, "1/1 CardInsufficientMemory"),
        # "core not enough": every core group taken, memory free
        (used(0, memory=32, cores=16, slices=1), sl(16, 1), {}, "1/1 CardInsufficientCore"),
        # "type mismatch": here a card model that cannot take the value (128 is no S4000 size)
        (used(0), sl(128, 4), {}, "1/1 CardTypeMismatch"),
        # "use uuid mismatch" / "no-use uuid match"
        (used(1), sl(2, 1), {F.USE_UUID: "n1-mthreads-0"}, "1/1 CardUuidMismatch"),
        (used(0), sl(2, 1), {F.NOUSE_UUID: "n1-mthreads-0"}, "1/1 CardUuidMismatch"),
        # "card overused": HAMi Count=100; we stop at the vendor's max_inst (16)
        (used(0, memory=32, cores=15, slices=16), sl(2, 1), {}, "1/1 CardTimeSlicingExhausted"),
        # "card exclusively": a whole-card ask on a card in use
        (used(0, memory=2, cores=1, slices=1), whole(), {}, "1/1 ExclusiveDeviceAllocateConflict"),
        # "mutex rejects used device"
        (
            used(0, memory=2, cores=1, slices=1),
            sl(2, 1),
            {F.GPU_POLICY: "mutex"},
            "1/1 ExclusiveDeviceAllocateConflict",
        ),
        # "CardNotHealth"
        (used(0, healthy=False), sl(2, 1), {}, "1/1 CardNotHealth"),
        (used(0, cordoned=True), sl(2, 1), {}, "1/1 CardCordoned"),
    ],
)
def test_hami_fit_table(
    state: CardState, req: SliceRequest, annotations: dict[str, str], reason: str
) -> None:
    result = fit([state], req, annotations)
    assert result.cards == () and result.reason == reason


def test_compute_units_exhausted_for_a_zero_core_ask() -> None:
    # HAMi "CardComputeUnitsExhausted": Usedcores == Totalcore and Coresreq == 0. Our admission never produces
    # a 0-core slice (defaultCores >= 1), but the rule holds for any SliceRequest that carries one.
    req = SliceRequest(Mode.SLICE, 1, 2, 0, 1, None, (ContainerShare("a", False, 2, 0),))
    assert fit([used(0, memory=32, cores=16, slices=2)], req, {}).reason == "1/1 CardComputeUnitsExhausted"
    assert fit([used(0, memory=32, cores=15, slices=2)], req, {}).cards == (0,)


def test_allocated_cards_insufficient_request() -> None:
    # HAMi "AllocatedCardsInsufficientRequest": some but not all requested cards found.
    states = [used(0, memory=2, cores=1, slices=1), used(1)]
    assert (
        fit(states, whole(2), {}).reason == "1/2 AllocatedCardsInsufficientRequest, 1/2 "
        "ExclusiveDeviceAllocateConflict"
    )
    states = [used(0), used(1), used(2, healthy=False), used(3, memory=8, cores=1, slices=1)]
    assert fit(states, whole(3), {}).reason == (
        "1/4 CardNotHealth, 1/4 ExclusiveDeviceAllocateConflict, 2/4 AllocatedCardsInsufficientRequest"
    )


@pytest.mark.parametrize(("n_cards", "n_req"), [(2, 3), (8, 9), (0, 1)])
def test_node_insufficient_device(n_cards: int, n_req: int) -> None:
    # HAMi "partial multi-card" asks 3 of 2 cards; fitInDevices rejects that before Fit.
    req = whole(n_req) if n_req > 1 else sl(2, 1)
    r = fit(cards(96, n_cards), req, {})
    assert not r.ok and r.reason == "1/1 NodeInsufficientDevice"


def test_exclusive_takes_memory_and_cores_of_the_whole_card() -> None:
    # HAMi "memory percentage" (100% of the card): our exclusive booking is the card's capacity.
    states = cards(160, 1)
    r = fit(states, whole(), {})
    assert r.cards == (0,)
    after = apply(states, whole(), r.cards)
    assert (after[0].memory_used, after[0].cores_used, after[0].slices_used) == (160, 16, 1)
    # Everything else is then refused: slices by memory, whole cards by exclusivity.
    assert fit(after, sl(2, 1), {}).reason == "1/1 CardInsufficientMemory"
    assert fit(after, whole(), {}).reason == "1/1 ExclusiveDeviceAllocateConflict"


def test_add_resource_usage() -> None:
    # HAMi TestDevices_AddResourceUsage: Used+1, cores and memory added.
    assert used(0, memory=4, cores=1).book(2, 1, 1) == used(0, memory=6, cores=2, slices=1)


# --- check order ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "req", "annotations", "reason"),
    [
        (used(0, healthy=False, cordoned=True), sl(2, 1), {}, "CardNotHealth"),
        (used(0, cordoned=True), sl(128, 1), {}, "CardCordoned"),
        (used(0), sl(128, 1), {F.NOUSE_UUID: "n1-mthreads-0"}, "CardTypeMismatch"),
        (used(0, slices=16), sl(2, 1), {F.NOUSE_UUID: "n1-mthreads-0"}, "CardUuidMismatch"),
        (
            used(0, memory=2, cores=1, slices=16),
            sl(2, 1),
            {F.GPU_POLICY: "mutex"},
            "CardTimeSlicingExhausted",
        ),
        (used(0, memory=96, cores=1, slices=1), whole(), {}, "ExclusiveDeviceAllocateConflict"),
        (used(0, memory=96, cores=16, slices=1), sl(2, 1), {}, "CardInsufficientMemory"),
    ],
)
def test_first_failing_check_names_the_card(
    state: CardState, req: SliceRequest, annotations: dict[str, str], reason: str
) -> None:
    assert fit([state], req, annotations).reason == f"1/1 {reason}"


def test_reasons_are_counted_per_card() -> None:
    states = [
        used(0, healthy=False),
        used(1, memory=90, cores=1, slices=1),
        used(2, memory=90, cores=1, slices=1),
        used(3, cordoned=True),
    ]
    assert fit(states, sl(32, 1), {}).reason == (
        "1/4 CardCordoned, 1/4 CardNotHealth, 2/4 CardInsufficientMemory"
    )


# --- uuid annotations -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("annotations", "chosen"),
    [
        ({F.USE_UUID: "n1-mthreads-0"}, (0,)),
        ({F.USE_UUID: " n1-mthreads-0 , n1-mthreads-2 "}, (2,)),  # comma list, trimmed; best of the allowed
        ({F.NOUSE_UUID: "n1-mthreads-3"}, (2,)),
        ({F.NOUSE_UUID: "n1-mthreads-3,n1-mthreads-2"}, (1,)),
        ({F.USE_UUID: "", F.NOUSE_UUID: ""}, (3,)),  # empty = no constraint
        ({F.USE_UUID: "n1-mthreads-1", F.NOUSE_UUID: "n1-mthreads-1"}, ()),  # nouse wins
        ({F.USE_UUID: "n1-mthreads-00"}, ()),  # exact match only
    ],
)
def test_use_and_nouse_uuid(annotations: dict[str, str], chosen: tuple[int, ...]) -> None:
    r = fit(cards(96, 4), sl(8, 1), annotations)
    assert r.cards == chosen
    if not chosen:
        assert r.reason == "4/4 CardUuidMismatch"


def test_multi_card_use_uuid_must_name_enough_cards() -> None:
    r = fit(cards(96, 4), whole(2), {F.USE_UUID: "n1-mthreads-1"})
    assert r.reason == "1/4 AllocatedCardsInsufficientRequest, 3/4 CardUuidMismatch"


# --- card order: spread / binpack / mutex ---------------------------------------------------------


def three() -> list[CardState]:
    return [used(0, memory=32, cores=4, slices=1), used(1), used(2, memory=64, cores=8, slices=2)]


@pytest.mark.parametrize(
    ("policy", "order"),
    [
        ("spread", [1, 0, 2]),  # least used first
        ("binpack", [2, 0, 1]),  # most used first
        ("mutex", [1, 0, 2]),  # mutex keeps the spread order, it only refuses used cards
        ("binpack,numa", [2, 0, 1]),  # HAMi policy chains
    ],
)
def test_card_order(policy: str, order: list[int]) -> None:
    assert [s.card.index for s in card_order(three(), policy)] == order


@pytest.mark.parametrize("policy", ["spread", "binpack"])
def test_ties_go_to_the_highest_index(policy: str) -> None:
    # HAMi sorts stably then scans backwards: among equal cards the last one is tried first.
    assert [s.card.index for s in card_order(cards(96, 4), policy)] == [3, 2, 1, 0]
    equal = [used(0, 8, 1, 1), used(1, 8, 1, 1), used(2), used(3, 8, 1, 1)]
    first = card_order(equal, policy)[0].card.index
    assert first == (3 if policy == "binpack" else 2)


@pytest.mark.parametrize(
    ("default", "annotations", "chosen"),
    [
        ("spread", {}, (1,)),
        ("binpack", {}, (2,)),
        ("spread", {F.GPU_POLICY: "binpack"}, (2,)),  # the pod's annotation beats the default
        ("binpack", {F.GPU_POLICY: " Spread "}, (1,)),  # trimmed, case-insensitive
        ("binpack", {F.GPU_POLICY: ""}, (2,)),  # empty = default
        ("spread", {F.GPU_POLICY: "mutex"}, (1,)),  # the only idle card
    ],
)
def test_policy_picks_the_card(default: str, annotations: dict[str, str], chosen: tuple[int, ...]) -> None:
    assert fit(three(), sl(16, 4), annotations, default).cards == chosen


def test_binpack_skips_cards_that_cannot_take_it() -> None:
    states = [used(0, memory=32, cores=4, slices=1), used(1), used(2, memory=90, cores=8, slices=2)]
    assert fit(states, sl(16, 4), {}, "binpack").cards == (0,)


def test_mutex_needs_idle_cards() -> None:
    states = [used(0, memory=2, cores=1, slices=1), used(1, memory=2, cores=1, slices=1)]
    assert fit(states, sl(2, 1), {F.GPU_POLICY: "mutex"}).reason == "2/2 ExclusiveDeviceAllocateConflict"


def test_multi_card_picks_the_best_cards_and_reports_them_sorted() -> None:
    assert fit(cards(96, 4), whole(2), {}).cards == (2, 3)
    states = cards(96, 4)
    states[3] = used(3, memory=2, cores=1, slices=1)
    assert fit(states, whole(2), {}).cards == (1, 2)
    assert fit(states, whole(3), {}).cards == (0, 1, 2)


# --- mixed fleets ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("req", "s4000", "s5000"),
    [
        (lambda: sl(128, 4), False, True),  # a 128-unit slice only on S5000
        (lambda: sl(96, 4), True, False),
        (lambda: sl(32, 4), True, True),
        # exclusive after admission: sgpu-memory = the card's capacity
        (
            lambda: pod_request(
                pod(
                    ctr("a", limits={VGPU: 1, "mthreads.com/sgpu-memory": 160, "mthreads.com/sgpu-core": 16})
                ),
                MIXED,
            ),
            False,
            True,
        ),
        (
            lambda: pod_request(
                pod(ctr("a", limits={VGPU: 1, "mthreads.com/sgpu-memory": 96, "mthreads.com/sgpu-core": 16})),
                MIXED,
            ),
            True,
            False,
        ),
        (
            lambda: pod_request(pod(ctr("a", limits={VGPU: 2, "mthreads.com/sgpu-memory": 320})), MIXED),
            False,
            True,
        ),
        # pinned before admission
        (lambda: whole(1, {PIN_ANNOTATION: "160"}), False, True),
        (lambda: whole(2, {PIN_ANNOTATION: "96"}), True, False),
        (lambda: whole(2), True, True),  # no model: any whole card
    ],
)
def test_model_mismatch_on_mixed_fleets(req: Any, s4000: bool, s5000: bool) -> None:
    r = req()
    s4 = node_inventory(node("s4", cores=32, memory=192), MIXED)
    s5 = node_inventory(node("s5", cores=32, memory=320), MIXED)
    for inv, ok in ((s4, s4000), (s5, s5000)):
        result = fit([CardState(c) for c in inv.cards], r, {})
        assert result.ok is ok
        if not ok:
            assert result.reason == "2/2 CardTypeMismatch"


# --- slices per card ------------------------------------------------------------------------------


@pytest.mark.parametrize("max_slices", [16, 4])
def test_slices_stop_at_max_inst(max_slices: int) -> None:
    states: list[CardState] = [CardState(Card("n1", 0, 160, max_slices=max_slices))]
    req = sl(2, 1)
    for _ in range(max_slices):
        r = fit(states, req, {})
        assert r.cards == (0,)
        states = apply(states, req, r.cards)
    assert states[0].slices_used == max_slices
    assert fit(states, req, {}).reason == "1/1 CardTimeSlicingExhausted"


def test_apply_books_only_the_chosen_cards() -> None:
    states = cards(96, 3)
    after = apply(states, sl(32, 8), (1,))
    assert after[0] == states[0] and after[2] == states[2]
    assert (after[1].memory_used, after[1].cores_used, after[1].slices_used) == (32, 8, 1)
    two = pod_request(pod(slice_ctr("a", 16, 4), slice_ctr("b", 8, 2)), MIXED)
    assert two is not None
    assert apply(states, two, (0,))[0] == used(0, memory=24, cores=6, slices=2)


# --- node score / extender priority ---------------------------------------------------------------


def test_node_score_formula() -> None:
    # ComputeDefaultScore = 10 x (slots used/total + cores used/total + memory used/total)
    states = [used(0, memory=48, cores=8, slices=4), used(1)]
    assert node_score(states) == pytest.approx(10 * (4 / 32 + 8 / 32 + 48 / 192))  # 6.25
    assert extender_priority(states, "binpack") == 2  # round(6.25 / 3)
    assert extender_priority(states, "spread") == 8


@pytest.mark.parametrize(
    ("states", "score", "binpack", "spread"),
    [
        ([used(0), used(1)], 0.0, 0, 10),
        ([used(0, memory=96, cores=16, slices=16)], 30.0, 10, 0),
        ([used(0, memory=160, cores=16, slices=1, capacity=160)], 10 * (1 / 16 + 1 + 1), 7, 3),
        ([], 0.0, 0, 10),
    ],
)
def test_node_score_and_priority(states: list[CardState], score: float, binpack: int, spread: int) -> None:
    assert node_score(states) == pytest.approx(score)
    assert extender_priority(states, "binpack") == binpack
    assert extender_priority(states, "spread") == spread


def test_binpack_prefers_fuller_nodes_spread_emptier_ones() -> None:
    empty, busy = cards(96, 2), [used(0, memory=64, cores=8, slices=2), used(1)]
    assert extender_priority(busy, "binpack") > extender_priority(empty, "binpack")
    assert extender_priority(busy, "spread") < extender_priority(empty, "spread")


def test_card_score() -> None:
    # HAMi card score: 10 x (slot + core + memory fill); used for ordering only.
    assert used(0, memory=48, cores=8, slices=8).score() == pytest.approx(10 * (8 / 16 + 8 / 16 + 48 / 96))


# --- event aggregation ----------------------------------------------------------------------------


def test_aggregate_failures() -> None:
    # FilteringFailed: "%d nodes %s(%s)" per reason type, e.g. "2 nodes CardInsufficientMemory(n1,n2)".
    failed: dict[str, F.Reasons | str] = {
        "n2": F.Reasons.of({"CardInsufficientMemory": 2}, 2),
        "n1": F.Reasons.of({"CardInsufficientMemory": 1, "CardUuidMismatch": 1}, 2),
        "n3": "node unregistered",
        "n4": fit(cards(96, 1), whole(2), {}).reasons,
    }
    assert aggregate_failures(failed) == [
        "2 nodes CardInsufficientMemory(n1,n2)",
        "1 nodes CardUuidMismatch(n1)",
        "1 nodes NodeInsufficientDevice(n4)",
        "1 nodes node unregistered(n3)",
    ]
    assert aggregate_failures({}) == []


def test_one_card_per_pod() -> None:
    # HAMi Test_CustomFilterRule: every mthreads container of a pod lands on the same single card. Here the
    # containers are folded into one SliceRequest, so one fit places them all on one card.
    req = pod_request(pod(slice_ctr("a", 16, 4), slice_ctr("b", 16, 4), slice_ctr("c", 8, 2)), MIXED)
    assert req is not None and req.cards == 1
    states = cards(96, 4)
    r = fit(states, req, {})
    assert r.cards == (3,)
    assert apply(states, req, r.cards)[3] == used(3, memory=40, cores=10, slices=3)


def test_type_is_the_card_model() -> None:
    # HAMi Test_checkType / "type mismatch" compare vendor type names; every card here is Mthreads, so
    # CardTypeMismatch means "this card model cannot take the request" (e.g. a 128-unit slice on S4000).
    assert fit(cards(96, 2), sl(128, 4), {}).reason == "2/2 CardTypeMismatch"
    assert fit(cards(160, 2), sl(128, 4), {}).cards == (1,)
