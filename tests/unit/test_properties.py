"""Property-based checks: capacity is never exceeded, records round-trip, parsers fail only their own way."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from shared.domain.admission import decide
from shared.domain.annotations import (
    ALLOCATED,
    AnnotationError,
    CardGrant,
    PodUsage,
    decode_allocation,
    device_id,
    encode_allocation,
    usage_from_annotations,
)
from shared.domain.fit import GPU_POLICY, CardState, apply, fit
from shared.domain.models import CardModel
from shared.domain.node import SGPU_CORES_LABEL, node_inventory
from shared.domain.request import RequestError, SliceRequest, pod_request
from tests.unit._k8s import CORE, GPU, MEM, VGPU, apply_patch, cfg, ctr, node, pod

MIXED = cfg((96, 160))
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

node_names = st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,20}[a-z0-9])?", fullmatch=True)


# --- random pods ----------------------------------------------------------------------------------


@st.composite
def slice_container(draw: st.DrawFn, name: str) -> dict[str, Any]:
    memory = draw(st.sampled_from([2, 4, 8, 16, 32, 64, 96, 128, 160, 3, 48]))
    limits: dict[str, object] = {VGPU: 1, MEM: memory}
    if draw(st.booleans()):
        limits[CORE] = draw(st.integers(1, 16))
    return ctr(name, limits=limits)


@st.composite
def admitted_pods(draw: st.DrawFn) -> dict[str, Any]:
    """Pods as the scheduler sees them: slices, exclusive and multi-card asks, with or without init."""
    kind = draw(st.sampled_from(["slice", "exclusive", "multi"]))
    if kind == "slice":
        apps = [draw(slice_container(f"a{i}")) for i in range(draw(st.integers(1, 3)))]
        inits = [draw(slice_container("i0"))] if draw(st.booleans()) else []
    elif kind == "exclusive":
        model = draw(st.sampled_from([96, 160]))
        limits = {VGPU: 1, MEM: model, CORE: 16} if draw(st.booleans()) else {VGPU: 1}
        apps, inits = [ctr("a0", limits=limits)], []
    else:
        n = draw(st.integers(2, 5))
        model = draw(st.sampled_from([96, 160]))
        limits = {VGPU: n, MEM: n * model, CORE: n * 16} if draw(st.booleans()) else {VGPU: n}
        apps = [ctr("a0", limits=limits)]
        inits = [ctr("i0", limits=limits)] if draw(st.booleans()) else []
    if draw(st.booleans()):
        apps.append(ctr("sidecar"))
    return pod(*apps, init=inits)


@st.composite
def nodes(draw: st.DrawFn) -> list[CardState]:
    model = draw(st.sampled_from([96, 160]))
    n = draw(st.integers(1, 8))
    name = draw(node_names)
    annotations = {"mtsched.io/max-inst": str(draw(st.integers(1, 16)))}
    cordon = draw(st.sets(st.integers(0, n - 1), max_size=2))
    if cordon:
        annotations["hami.io/device-cordon"] = ",".join(device_id(name, i) for i in cordon)
    inv = node_inventory(node(name, cores=16 * n, memory=model * n, annotations=annotations), MIXED)
    assert inv.error == "" and len(inv.cards) == n
    return [CardState(c) for c in inv.cards]


def request_or_none(p: dict[str, Any]) -> SliceRequest | None:
    try:
        return pod_request(p, MIXED)
    except RequestError:
        return None


@FAST
@given(
    states=nodes(),
    pods=st.lists(admitted_pods(), min_size=1, max_size=40),
    policy=st.sampled_from(["spread", "binpack", "mutex"]),
)
def test_fit_and_apply_never_exceed_a_card(
    states: list[CardState], pods: list[dict[str, Any]], policy: str
) -> None:
    for p in pods:
        req = request_or_none(p)
        if req is None:
            continue
        result = fit(states, req, {GPU_POLICY: policy})
        event(f"{req.mode} {'fits' if result.ok else 'does not fit'}")
        assert result.ok != bool(result.reason)
        if not result.ok:
            continue
        assert len(result.cards) == req.cards == len(set(result.cards))
        by_index = {s.card.index: s for s in states}
        for i in result.cards:
            card = by_index[i].card
            assert card.healthy and not card.cordoned
            if req.model is not None:
                assert card.capacity == req.model
        states = apply(states, req, result.cards)
        for s in states:
            assert 0 <= s.memory_used <= s.card.capacity
            assert 0 <= s.cores_used <= s.card.cores == 16
            assert 0 <= s.slices_used <= s.card.max_slices
            if s.card.cordoned:
                assert s.idle


@FAST
@given(states=nodes(), p=admitted_pods())
def test_the_record_books_what_fit_booked(states: list[CardState], p: dict[str, Any]) -> None:
    """The allocation annotation a bound pod carries implies exactly the booking made for it."""
    req = request_or_none(p)
    assume(req is not None)
    assert req is not None
    result = fit(states, req, {})
    assume(result.ok)
    node_name = states[0].card.node
    capacity = states[0].card.capacity
    grants = [
        [] if s.empty else [CardGrant(device_id(node_name, i), s.memory * 512, s.cores) for i in result.cards]
        for s in req.shares_for(capacity)
    ]
    bound = dict(
        p,
        metadata={**p["metadata"], "annotations": {ALLOCATED: encode_allocation(grants)}},
        spec={**p["spec"], "nodeName": node_name},
    )
    assert usage_from_annotations(bound) == PodUsage(node_name, result.cards, *req.booking_for(capacity))


# --- annotation encoding --------------------------------------------------------------------------


grants = st.builds(
    lambda n, i, units, cores: CardGrant(device_id(n, i), units * 512, cores),
    node_names,
    st.integers(0, 63),
    st.integers(1, 4096),
    st.integers(0, 16),
)


@FAST
@given(st.lists(st.lists(grants, max_size=4), min_size=1, max_size=6))
def test_decode_encode_round_trip(containers: list[list[CardGrant]]) -> None:
    value = encode_allocation(containers)
    assert decode_allocation(value) == containers
    assert encode_allocation(decode_allocation(value)) == value


@FAST
@given(
    st.text(alphabet=st.sampled_from(list("nM-mthreads,:;0123456789 ²٣\n+.x")), max_size=80)
    | st.text(max_size=40)
)
def test_decode_fails_only_with_annotation_error(value: str) -> None:
    try:
        out = decode_allocation(value)
    except AnnotationError:
        return
    assert encode_allocation(out) == value  # whatever decodes is exactly what we would have written


@FAST
@given(st.lists(st.lists(grants, min_size=1, max_size=3), min_size=1, max_size=3), st.data())
def test_corrupted_records_fail_loudly(containers: list[list[CardGrant]], data: st.DataObject) -> None:
    value = encode_allocation(containers)
    i = data.draw(st.integers(0, len(value) - 1))
    bad = value[:i] + data.draw(st.sampled_from(["", "x", "²", ",", ":", ";", "-", " "])) + value[i + 1 :]
    try:
        out = decode_allocation(bad)
    except AnnotationError:
        return
    assert encode_allocation(out) == bad  # the corruption happened to spell another valid record


# --- node and pod parsers -------------------------------------------------------------------------


quantities = st.one_of(
    st.integers(-5, 2000).map(str),
    st.sampled_from(["", "00", "1.5", "16Gi", "1k", "²", "+16", " 32 ", "1e3", "١٦"]),
)


@FAST
@given(
    cores=quantities,
    memory=quantities,
    label=st.none() | st.text(alphabet=st.sampled_from(list("0123-,² a")), max_size=10),
)
def test_node_inventory_never_raises(cores: str, memory: str, label: str | None) -> None:
    labels = {SGPU_CORES_LABEL: label} if label is not None else {}
    inv = node_inventory(node("n", cores=cores, memory=memory, labels=labels), MIXED)
    assert not (inv.cards and inv.error)
    if inv.cards:
        assert len(inv.cards) * 16 == int(cores)
        assert len(inv.cards) * inv.cards[0].capacity == int(memory)
        assert CardModel(inv.cards[0].capacity) in MIXED.models
        assert len({c.index for c in inv.cards}) == len(inv.cards)


@st.composite
def container_limits(draw: st.DrawFn) -> dict[str, object]:
    """Mostly well-formed asks (so admission says yes often), sometimes anything at all."""
    kind = draw(st.sampled_from(["slice", "exclusive", "multi", "wild"]))
    limits: dict[str, object] = {}
    if kind == "slice":
        limits = {VGPU: "1", MEM: draw(st.sampled_from(["2", "8", "32", "64", "96", "128", "160"]))}
        if draw(st.booleans()):
            limits[CORE] = str(draw(st.integers(1, 16)))
    elif kind == "exclusive":
        limits = {VGPU: "1"} if draw(st.booleans()) else {VGPU: "1", CORE: "16"}
    elif kind == "multi":
        n = draw(st.integers(2, 8))
        limits = {VGPU: str(n)}
        if draw(st.booleans()):
            limits[MEM] = str(n * draw(st.sampled_from([96, 160])))
        if draw(st.booleans()):
            limits[CORE] = str(16 * n)
    else:
        limits = {VGPU: draw(quantities)}
        for key in (MEM, CORE):
            value = draw(st.none() | quantities)
            if value is not None:
                limits[key] = value
    if draw(st.integers(0, 9)) == 0:
        limits[GPU] = "1"
    return limits


@FAST
@given(
    limits=container_limits(), pin=st.sampled_from([None, None, None, None, "96", "160", "S5000", "²", "x"])
)
def test_admission_and_parsing_fail_only_their_own_way(limits: dict[str, object], pin: str | None) -> None:
    p = pod(ctr("a", limits=limits), annotations={"mtsched.io/card-memory": pin} if pin else None)
    d = decide(p, MIXED, (96, 160))  # never raises
    event("allowed" if d.allowed else "denied")
    if not d.allowed:
        assert d.message and d.code == 403
        return
    after = apply_patch(p, d.patch)
    req = pod_request(after, MIXED)  # what admission let through, the scheduler can read (HAMi#2987)
    assert req is not None
    assert req.cards == int(str(limits[VGPU]))
    if not req.whole_cards:  # some configured model takes every slice value and their sum
        assert any(
            all(s.empty or CardModel(m).accepts(s.memory) for s in req.shares) and req.memory <= m
            for m in (96, 160)
        )
