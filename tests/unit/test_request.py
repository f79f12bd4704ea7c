"""Request parsing and the sharing rules (scheduler side: pods as they are after admission)."""

from __future__ import annotations

from typing import Any

import pytest

from shared.domain.models import CardModel
from shared.domain.request import (
    PIN_ANNOTATION,
    ContainerShare,
    Mode,
    RequestError,
    card_accepts,
    parse_quantity,
    pinned_model,
    pod_request,
    read_asks,
    shape_request,
)
from tests.unit._k8s import CORE, GPU, MEM, S4000, S5000, VGPU, cfg, ctr, pod, slice_ctr

C96 = cfg((96,))
C160 = cfg((160,))
MIXED = cfg((96, 160))


def problems(p: dict[str, Any], c: Any = C96) -> str:
    with pytest.raises(RequestError) as e:
        pod_request(p, c)
    return str(e.value)


# --- quantities -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "n"), [("1", 1), ("32", 32), (7, 7), (" 8 ", 8), ("+4", 4), ("0016", 16), ("64", 64)]
)
def test_parse_quantity_accepts_plain_integers(raw: object, n: int) -> None:
    assert parse_quantity(raw, "c", VGPU, 64) == n


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ("1.5", "not a whole number"),  # HAMi rounds this up with Value(); we refuse
        ("16Gi", "is 17179869184, written with"),  # HAMi test "memory 16Gi"
        ("16.0Gi", "written with a decimal point, an exponent or a unit suffix"),  # HAMi test "decimal form"
        ("1e3", "'1e3' is 1000, written with a decimal point, an exponent or a unit suffix; use a plain integer"),
        ("5Ki", "is 5120, written with"),
        ("5.0", "is 5, written with a decimal point"),
        ("2000m", "(= 2) is 2, written with"),
        ("1e30", "more than 10^12, written with"),
        ("1e31", "too large"),
        ("1e-3", "not a whole number"),
        ("1.5Ki", "is 1536, written with"),
        ("500m", "not a whole number"),
        ("", "not a whole number"),
        ("one", "not a whole number"),
        (True, "not a whole number"),
        ("-1", "negative"),  # HAMi test count -1
        ("0", "at least 1"),  # HAMi test count 0
        ("000", "at least 1"),
        ("-0", "is 0; it must be at least 1"),  # zero however written: not "negative", not "too large"
        ("0e99", "is 0; it must be at least 1"),
        ("-0.0Gi", "is 0; it must be at least 1"),
        ("0m", "is 0; it must be at least 1"),
        ("e5", "not a whole number"),
        ("65", "too large; at most 64"),
        ("4294967296", "too large"),  # HAMi test count 2^32
        ("99999999999999999999999", "too large"),
    ],
)
def test_parse_quantity_errors_name_container_resource_value(raw: object, needle: str) -> None:
    with pytest.raises(RequestError) as e:
        parse_quantity(raw, "trainer", VGPU, 64)
    msg = str(e.value)
    assert needle in msg
    assert 'container "trainer"' in msg
    assert VGPU in msg
    assert repr(raw) in msg  # the offending value, as given


# --- read_asks ------------------------------------------------------------------------------------


def test_limits_are_read_before_requests() -> None:
    p = pod(ctr("a", limits={VGPU: 1, MEM: 32}, requests={VGPU: 1, MEM: 64, CORE: 4}))
    (a,) = read_asks(p, C96)
    assert (a.count, a.memory, a.cores) == (1, 32, 4)  # memory from limits; cores only in requests
    assert a.memory_in_requests_only is False
    assert a.cores_in_requests_only is True


def test_requests_used_when_limits_absent() -> None:
    (a,) = read_asks(pod(ctr("a", requests={VGPU: 2})), C96)
    assert a.count == 2 and a.memory is None and a.cores is None


def test_init_containers_come_first() -> None:
    p = pod(slice_ctr("app", 16, 4), init=[slice_ctr("setup", 64, 8)])
    asks = read_asks(p, C96)
    assert [(a.name, a.init, a.memory) for a in asks] == [("setup", True, 64), ("app", False, 16)]


def test_whole_gpu_seen_in_limits_or_requests() -> None:
    p = pod(ctr("a", limits={GPU: 1}), ctr("b", requests={GPU: 1}), ctr("c"))
    assert [a.whole_gpu for a in read_asks(p, C96)] == [True, True, False]
    assert not any(a.asks_slices for a in read_asks(p, C96))


def test_every_bad_quantity_of_the_pod_is_reported() -> None:
    p = pod(ctr("a", limits={VGPU: "1.5"}), ctr("b", limits={VGPU: 1, MEM: "16Gi", CORE: "-1"}))
    with pytest.raises(RequestError) as e:
        read_asks(p, C96)
    assert len(e.value.problems) == 3
    assert "container \"a\": mthreads.com/vgpu='1.5'" in e.value.problems[0]
    assert "container \"b\": mthreads.com/sgpu-memory='16Gi'" in e.value.problems[1]
    assert "container \"b\": mthreads.com/sgpu-core='-1'" in e.value.problems[2]


def test_memory_upper_bound_follows_the_largest_model() -> None:
    # 64 cards of the largest configured model; above that it is a typo, not a request.
    assert read_asks(pod(ctr("a", limits={VGPU: 64, MEM: 64 * 160})), C160)[0].memory == 10240
    with pytest.raises(RequestError, match="too large; at most 6144"):
        read_asks(pod(ctr("a", limits={VGPU: 1, MEM: 6145})), C96)


# --- slices ---------------------------------------------------------------------------------------


def test_seed_example_slice() -> None:
    # Seed pod: vgpu 1, sgpu-memory 32 (16 GiB), sgpu-core 8 (50% of the card).
    req = pod_request(pod(slice_ctr("gpushare-pod-1", 32, 8)), C96)
    assert req is not None
    assert (req.mode, req.cards, req.memory, req.cores, req.slices) == (Mode.SLICE, 1, 32, 8, 1)
    assert req.model is None
    assert req.booking_for(96) == (32, 8, 1) == req.booking_for(160)
    assert req.shares == (ContainerShare("gpushare-pod-1", False, 32, 8),)


@pytest.mark.parametrize("default", [1, 4, 16])
def test_slice_without_cores_gets_the_configured_default(default: int) -> None:
    req = pod_request(pod(slice_ctr("a", 16, None)), cfg((96,), default_cores=default))
    assert req is not None and req.cores == default


def test_all_slice_containers_share_one_card() -> None:
    # "Only one Mthreads device can be shared in a pod (even if there are multiple containers)."
    p = pod(slice_ctr("a", 32, 4), slice_ctr("b", 16, 2), ctr("sidecar"))
    req = pod_request(p, C96)
    assert req is not None
    assert (req.cards, req.memory, req.cores, req.slices) == (1, 48, 6, 2)
    assert req.shares[2] == ContainerShare("sidecar", False, 0, 0) and req.shares[2].empty


def test_init_containers_count_at_their_peak() -> None:
    # init: 64 units / 8 cores, runs alone; apps: 16+32 units / 4+2 cores, run together.
    p = pod(slice_ctr("a", 16, 4), slice_ctr("b", 32, 2), init=[slice_ctr("setup", 64, 8)])
    req = pod_request(p, C96)
    assert req is not None
    assert (req.memory, req.cores, req.slices) == (64, 8, 2)  # max(48, 64), max(6, 8), two app slices
    assert [s.name for s in req.shares] == ["setup", "a", "b"]  # annotation order: init first


def test_init_only_slice_takes_one_slice() -> None:
    req = pod_request(pod(ctr("app"), init=[slice_ctr("setup", 8, 2)]), C96)
    assert req is not None and (req.memory, req.cores, req.slices) == (8, 2, 1)


@pytest.mark.parametrize("cores", [1, 8, 16])
def test_slice_cores_in_range(cores: int) -> None:
    req = pod_request(pod(slice_ctr("a", 32, cores)), C96)
    assert req is not None and req.cores == cores


def test_slice_cores_above_16_rejected() -> None:
    # HAMi has no range check (and clamps > 100 in Fit); the seeds say sgpu-core is 1 to 16.
    assert 'container "a": mthreads.com/sgpu-core=17 is outside 1..16' in problems(
        pod(slice_ctr("a", 32, 17))
    )


def test_pod_cores_above_a_card_rejected() -> None:
    msg = problems(pod(slice_ctr("a", 16, 10), slice_ctr("b", 16, 7)))
    assert "ask 17 mthreads.com/sgpu-core in all; a card has 16" in msg


def test_max_slices_per_card() -> None:
    msg = problems(pod(*(slice_ctr(f"c{i}", 2, 1) for i in range(3))), cfg((96,), max_slices_per_card=2))
    assert "3 slice containers on one card; a card takes at most 2 slices" in msg
    msg = problems(pod(*(slice_ctr(f"c{i}", 2, 1) for i in range(17))))
    assert "takes at most 16 slices" in msg
    req = pod_request(pod(*(slice_ctr(f"c{i}", 2, 1) for i in range(16))), C96)
    assert req is not None and req.slices == 16 and req.cores == 16


def test_slice_memory_not_checked_against_a_model_until_fit() -> None:
    # HAMi Test_GenerateResourceRequests "all resources set": mem 1000 -> Memreq 512000 (no legality check).
    # We keep the request (it is not "no request") and no card of any model accepts it.
    req = pod_request(
        pod(ctr("a", limits={VGPU: 1, MEM: 1000, CORE: 1}, requests={VGPU: 1, MEM: 1000, CORE: 1})), C96
    )
    assert req is not None and req.memory == 1000
    assert not card_accepts(96, req) and not card_accepts(160, req)


# --- exclusive and multi-card ---------------------------------------------------------------------


def test_exclusive_before_admission_takes_the_whole_card() -> None:
    # "To take a sliced card exclusively, request only mthreads.com/vgpu."
    req = pod_request(pod(ctr("a", limits={VGPU: 1})), C96)
    assert req is not None
    assert (req.mode, req.cards, req.model) == (Mode.EXCLUSIVE, 1, None)
    assert req.booking_for(96) == (96, 16, 1)
    assert req.booking_for(160) == (160, 16, 1)
    assert req.shares_for(160) == (ContainerShare("a", False, 160, 16),)


def test_exclusive_after_admission_is_the_full_card() -> None:
    # The webhook writes sgpu-memory = card capacity and sgpu-core = 16.
    req = pod_request(pod(ctr("a", limits={VGPU: 1, MEM: 160, CORE: 16})), C160)
    assert req is not None and req.booking_for(160) == (160, 16, 1)
    assert card_accepts(160, req) and not card_accepts(96, req)


def test_exclusive_with_16_cores_and_no_memory_is_exclusive() -> None:
    req = pod_request(pod(ctr("a", limits={VGPU: 1, CORE: 16})), C96)
    assert req is not None and req.mode is Mode.EXCLUSIVE


def test_exclusive_with_partial_cores_rejected() -> None:
    # HAMi overwrites sgpu-core to 16 ({vgpu:1, core:8} -> exclusive). We refuse: the user asked for half a
    # card's compute but no memory, which is neither a slice (needs memory) nor "vgpu only".
    msg = problems(pod(ctr("a", limits={VGPU: 1, CORE: 8})))
    assert 'container "a": mthreads.com/sgpu-core=8 without mthreads.com/sgpu-memory' in msg


def test_exclusive_cannot_share_with_slices_or_other_apps() -> None:
    msg = problems(pod(ctr("a", limits={VGPU: 1}), slice_ctr("b", 16, 4)))
    assert "cannot share it with slice containers (b)" in msg
    msg = problems(pod(ctr("a", limits={VGPU: 1}), ctr("b", limits={VGPU: 1})))
    assert "no other app container of the pod may share it (a, b)" in msg


def test_exclusive_init_and_app_run_one_after_the_other() -> None:
    req = pod_request(pod(ctr("a", limits={VGPU: 1}), init=[ctr("i", limits={VGPU: 1})]), C96)
    assert req is not None and req.mode is Mode.EXCLUSIVE and req.cards == 1
    assert req.shares_for(96) == (ContainerShare("i", True, 96, 16), ContainerShare("a", False, 96, 16))


@pytest.mark.parametrize(("n", "model"), [(2, S4000), (7, S4000), (8, S5000)])
def test_multi_card_after_admission(n: int, model: int) -> None:
    req = pod_request(pod(ctr("a", limits={VGPU: n, MEM: n * model, CORE: n * 16})), MIXED)
    assert req is not None
    assert (req.mode, req.cards, req.memory, req.cores, req.model) == (Mode.MULTI, n, model, 16, model)
    assert req.booking_for(model) == (model, 16, 1)
    assert card_accepts(model, req) and not card_accepts(S4000 + S5000 - model, req)


def test_hami_2987_vgpu_7_is_never_no_request() -> None:
    # HAMi#2987: vgpu 7 -> webhook writes sgpu-core 112 -> a per-card <= 100 check empties the request ->
    # the pod is bound with no device. Here it is a MULTI request for 7 whole cards, before and after
    # admission (HAMi's webhook output {core 112, mem 672} included).
    for limits in ({VGPU: 7}, {VGPU: 7, CORE: 112, MEM: 7 * 96}, {VGPU: 7, CORE: 112}):
        req = pod_request(pod(ctr("a", limits=limits)), C96)
        assert req is not None, limits
        assert req.mode is Mode.MULTI and req.cards == 7
        assert req.booking_for(96) == (96, 16, 1)


@pytest.mark.parametrize(
    ("limits", "needle"),
    [
        ({VGPU: 2, CORE: 8}, "mthreads.com/sgpu-core=8 with mthreads.com/vgpu=2"),
        ({VGPU: 2, MEM: 3}, "mthreads.com/sgpu-memory=3 with mthreads.com/vgpu=2"),
        # HAMi silently overwrites {vgpu 2, mem 2, core 1} to {core 32, mem 192}; we refuse contradictions.
        ({VGPU: 2, MEM: 2, CORE: 1}, "must be 32 (or be left out)"),
    ],
)
def test_multi_card_is_whole_cards_only(limits: dict[str, object], needle: str) -> None:
    # "Multi-card jobs may only request whole cards."
    msg = problems(pod(ctr("a", limits=limits)))
    assert needle in msg and "multi-card pods take whole cards" in msg


def test_multi_card_memory_must_match_the_pinned_model() -> None:
    p = pod(ctr("a", limits={VGPU: 2, MEM: 192, CORE: 32}), annotations={PIN_ANNOTATION: "160"})
    assert "mthreads.com/sgpu-memory must be 320" in problems(p, MIXED)


def test_multi_card_containers_must_agree() -> None:
    assert "multi-card pod's mthreads containers must all ask the same whole cards" in problems(
        pod(ctr("a", limits={VGPU: 2}), init=[ctr("i", limits={VGPU: 3})])
    )
    assert "only one app container may ask mthreads.com/vgpu=2" in problems(
        pod(ctr("a", limits={VGPU: 2}), ctr("b", limits={VGPU: 2}))
    )
    # Without a pin the first container's memory would decide the model: 96-unit cards for an app
    # container whose limit says 160 per card. Refused.
    assert "ask different mthreads.com/sgpu-memory (192, 320)" in problems(
        pod(
            ctr("a", limits={VGPU: 2, MEM: 320, CORE: 32}),
            init=[ctr("i", limits={VGPU: 2, MEM: 192, CORE: 32})],
        ),
        MIXED,
    )


def test_multi_card_init_and_app_share_the_same_cards() -> None:
    p = pod(
        ctr("a", limits={VGPU: 2, MEM: 320, CORE: 32}), init=[ctr("i", limits={VGPU: 2, MEM: 320, CORE: 32})]
    )
    req = pod_request(p, MIXED)
    assert req is not None and req.cards == 2 and req.model == 160
    assert [s.memory for s in req.shares_for(160)] == [160, 160]


# --- what is not ours / what is refused -----------------------------------------------------------


@pytest.mark.parametrize(
    "p",
    [
        pod(ctr("a")),  # CPU only
        pod(ctr("a", limits={GPU: 1})),  # whole cards: default scheduler, vendor device plugin
        pod(ctr("a", limits={"nvidia.com/gpu": 1, "cpu": "2"})),
        {"metadata": {}, "spec": {}},
    ],
)
def test_pods_without_slices_are_not_ours(p: dict[str, Any]) -> None:
    assert pod_request(p, C96) is None


def test_whole_gpu_in_another_container_is_allowed() -> None:
    # The seeds forbid mixing in one container only.
    req = pod_request(pod(ctr("whole", limits={GPU: 1}), slice_ctr("s", 16, 4)), C96)
    assert req is not None and req.memory == 16 and req.shares[0].empty


@pytest.mark.parametrize(
    ("limits", "requests"),
    [
        ({GPU: 1, VGPU: 1}, None),
        ({GPU: 1, VGPU: 1, MEM: 32, CORE: 8}, None),
        ({VGPU: 1, MEM: 32, CORE: 8}, {GPU: 1}),  # HAMi#2988 checks limits and requests
        ({GPU: 1, MEM: 32}, None),  # any sgpu-* counts, even without vgpu
        ({GPU: 1, CORE: 4}, None),
    ],
)
def test_whole_gpu_mixed_with_slices_in_one_container_rejected(
    limits: dict[str, object], requests: dict[str, object] | None
) -> None:
    msg = problems(pod(ctr("mixed", limits=limits, requests=requests)))
    assert 'container "mixed": mthreads.com/gpu cannot be mixed with' in msg
    assert "mthreads.com/vgpu" in msg and "outside the scheduler's accounting" in msg


@pytest.mark.parametrize("limits", [{MEM: 2, CORE: 1}, {MEM: 32}, {CORE: 4}])
def test_sgpu_resources_without_vgpu_rejected(limits: dict[str, object]) -> None:
    # HAMi ignores such containers (found=false) and the vendor plugin would hand out slices outside any
    # accounting. We refuse and say what to add.
    assert "need mthreads.com/vgpu; add mthreads.com/vgpu: 1 for a slice" in problems(
        pod(ctr("a", limits=limits))
    )


# --- HAMi Test_GenerateResourceRequests, re-expressed ---------------------------------------------


@pytest.mark.parametrize(
    ("container", "expect"),
    [
        # count only -> HAMi {Nums 1, Memreq 0, MemPct 100}: the whole card. Same here.
        (ctr("a", requests={VGPU: 1}), (Mode.EXCLUSIVE, 1)),
        # count in neither -> HAMi {} ("not ours"). We refuse instead (see above).
        (ctr("a", requests={MEM: 1000, CORE: 1}), "need mthreads.com/vgpu"),
        # count 0 / -1 / 2^32 -> HAMi {} = "no request": the pod would be bound with no device. Errors here.
        (ctr("a", limits={VGPU: 0, MEM: 1000, CORE: 1}), "must be at least 1"),
        (ctr("a", limits={VGPU: -1, MEM: 1000, CORE: 1}), "is negative"),
        (ctr("a", limits={VGPU: 4294967296, MEM: 1000, CORE: 1}), "too large"),
        # memory 16Gi / 16.0Gi -> HAMi {}; errors here.
        (ctr("a", limits={VGPU: 1, MEM: "16Gi", CORE: 1}), "written with a decimal point, an exponent or a unit"),
        (ctr("a", limits={VGPU: 1, MEM: "16.0Gi", CORE: 1}), "written with a decimal point, an exponent or a unit"),
    ],
)
def test_hami_generate_resource_requests_table(container: dict[str, Any], expect: object) -> None:
    if isinstance(expect, str):
        assert expect in problems(pod(container))
    else:
        req = pod_request(pod(container), C96)
        assert req is not None and (req.mode, req.cards) == expect


# --- the pin annotation and model acceptance ------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "units"),
    [
        ("160", 160),
        ("96", 96),
        (" 160 ", 160),
        ("S5000", 160),
        ("s4000", 96),
        ("MTT-S5000", 160),
        ("mtt-s4000", 96),
    ],
)
def test_pinned_model(raw: str, units: int) -> None:
    assert pinned_model(pod(ctr("a"), annotations={PIN_ANNOTATION: raw}), MIXED) == CardModel(units)


@pytest.mark.parametrize("raw", ["128", "S6000", "", "1.5e2", "²", "١٦٠", "-160"])
def test_pinned_model_unknown(raw: str) -> None:
    with pytest.raises(RequestError) as e:
        pinned_model(pod(ctr("a"), annotations={PIN_ANNOTATION: raw}), MIXED)
    assert PIN_ANNOTATION in str(e.value) and "allowed: 96, 160" in str(e.value)


def test_pinned_model_must_be_configured() -> None:
    with pytest.raises(RequestError, match="allowed: 96 "):
        pinned_model(pod(ctr("a"), annotations={PIN_ANNOTATION: "S5000"}), C96)
    assert pinned_model(pod(ctr("a")), C96) is None


def test_pinned_slice_must_be_valid_on_the_pinned_model() -> None:
    p = pod(slice_ctr("a", 96, 4), annotations={PIN_ANNOTATION: "S5000"})
    assert 'container "a": mthreads.com/sgpu-memory=96 is not valid on the pinned MTT S5000' in problems(
        p, MIXED
    )
    req = pod_request(pod(slice_ctr("a", 128, 4), annotations={PIN_ANNOTATION: "160"}), MIXED)
    assert req is not None and req.model == 160
    assert card_accepts(160, req) and not card_accepts(96, req)


@pytest.mark.parametrize(
    ("memory", "on_s4000", "on_s5000"),
    [
        (128, False, True),  # a 128-unit slice only on S5000
        (160, False, True),
        (96, True, False),  # 96 is a whole S4000, not an S5000 slice size
        (32, True, True),
        (2, True, True),
    ],
)
def test_card_accepts_mixed_fleet(memory: int, on_s4000: bool, on_s5000: bool) -> None:
    req = pod_request(pod(slice_ctr("a", memory, 4)), MIXED)
    assert req is not None
    assert card_accepts(96, req) is on_s4000
    assert card_accepts(160, req) is on_s5000


def test_card_accepts_every_share_not_just_the_sum() -> None:
    # 96 + 32: each container's value must be valid on the card; 96 is not an S5000 slice size.
    req = pod_request(pod(slice_ctr("a", 96, 4), slice_ctr("b", 32, 4)), MIXED)
    assert req is not None and not card_accepts(160, req)


def test_shape_request_on_completed_asks_none_without_slices() -> None:
    assert shape_request(read_asks(pod(ctr("a", limits={GPU: 2})), C96), C96, None) is None


def test_multi_card_model_from_any_container_with_memory() -> None:
    # Un-admitted pod: the init container leaves memory out, the app container says 160 per card. The app's
    # value must pick the model, or the pod could land on 96-unit cards.
    p = pod(ctr("a", limits={VGPU: 2, MEM: 320}), init=[ctr("i", limits={VGPU: 2})])
    req = pod_request(p, MIXED)
    assert req is not None and req.model == 160
    assert card_accepts(160, req) and not card_accepts(96, req)


@pytest.mark.parametrize(("raw", "shown"), [("1500m", "(= 1.5)"), ("500m", "(= 0.5)"), ("-500m", "(= -0.5)")])
def test_canonical_milli_quantities_are_explained(raw: str, shown: str) -> None:
    # The API server hands admission "1.5" as "1500m": the message shows both forms.
    with pytest.raises(RequestError) as e:
        parse_quantity(raw, "c", CORE, 16)
    assert f"{CORE}='{raw}' {shown}" in str(e.value)
    assert "not a whole number" in str(e.value)


@pytest.mark.parametrize(("raw", "value"), [("4k", 4000), ("2k", 2000), ("+7", 7), ("1M", 10**6)])
def test_api_server_canonical_forms_of_whole_numbers(raw: str, value: int) -> None:
    # The API server rewrites 4000 as "4k" before admission; it is still a whole number.
    assert parse_quantity(raw, "c", "mthreads.com/sgpu-memory", 10**7) == value


@pytest.mark.parametrize(("raw", "needle"), [
    ("9" * 5000, "is too long"),  # int() would refuse it with a ValueError above 4300 digits
    ("1" * 65, "is too long"),
    (" " * 100 + "1", "is too long"),
    (2**70, "is too large"),  # a Python int from a caller, not from JSON (orjson reads those as floats)
])
def test_parse_quantity_bounds_the_input_before_parsing(raw: object, needle: str) -> None:
    with pytest.raises(RequestError) as e:
        parse_quantity(raw, "c", VGPU, 64)
    assert needle in str(e.value) and len(str(e.value)) < 300


def test_pin_annotation_of_5000_digits_is_a_request_error() -> None:
    with pytest.raises(RequestError, match=r"\(5000 characters\) names no configured card model"):
        pinned_model(pod(ctr("a"), annotations={PIN_ANNOTATION: "9" * 5000}), MIXED)


@pytest.mark.parametrize("p", [
    {"spec": {"containers": [{"resources": 5}]}},
    {"spec": {"containers": 5}},
    {"metadata": {"annotations": {PIN_ANNOTATION: 160}}, "spec": {"containers": []}},
])
def test_pod_request_refuses_what_it_cannot_read(p: dict[str, Any]) -> None:
    # fail closed: a pod of the wrong shape is an error, never "asks for nothing"
    with pytest.raises(RequestError, match=r": got .*; allowed: "):
        pod_request(p, C96)


@pytest.mark.parametrize(("config", "pin", "allowed"), [
    (C160, "96", "allowed: 160 (or S5000), memoryPerCard [160]"),  # S4000 was listed although refused
    (C96, "S5000", "allowed: 96 (or S4000), memoryPerCard [96]"),
    (MIXED, "S7000", "allowed: 96, 160 (or S4000/S5000), memoryPerCard [96, 160]"),
    (cfg((64,)), "96", "allowed: 64, memoryPerCard [64]"),  # a card with no name: no alias to offer
])
def test_a_wrong_pin_lists_only_what_this_cluster_takes(config: Any, pin: str, allowed: str) -> None:
    with pytest.raises(RequestError) as e:
        pinned_model(pod(ctr("a"), annotations={PIN_ANNOTATION: pin}), config)
    assert allowed in str(e.value), str(e.value)
