"""HAMi-compatible allocation annotations (reference §6): encoding, strict decoding, booked usage."""

from __future__ import annotations

from typing import Any

import pytest

from shared.domain.annotations import (
    ALLOCATED,
    BIND_PHASE,
    BIND_TIME,
    GPU_INDEX,
    PREDICATE_NODE,
    PREDICATE_TIME,
    SCHEDULER_OWNED_KEYS,
    VGPU_NODE,
    VGPU_TIME,
    AnnotationError,
    CardGrant,
    PodUsage,
    binding_annotations,
    decode_allocation,
    device_id,
    encode_allocation,
    gpu_index,
    usage_from_annotations,
)
from tests.unit._k8s import ctr, pod


def g(ident: str, units: int, cores: int) -> CardGrant:
    return CardGrant(ident, units * 512, cores)


def test_wire_keys_are_hamis() -> None:
    assert ALLOCATED == "hami.io/mthreads-vgpu-devices-allocated"
    assert GPU_INDEX == "mthreads.com/gpu-index"
    assert PREDICATE_NODE == "mthreads.com/predicate-node"
    assert PREDICATE_TIME == "mthreads.com/predicate-time"
    assert VGPU_NODE == "hami.io/vgpu-node"
    assert VGPU_TIME == "hami.io/vgpu-time"
    assert BIND_PHASE == "hami.io/bind-phase"
    assert BIND_TIME == "hami.io/bind-time"
    assert "hami.io/mthreads-vgpu-devices-to-allocate" in SCHEDULER_OWNED_KEYS
    assert "mthreads.com/request-gpu-num" not in SCHEDULER_OWNED_KEYS  # written by the webhook, not bind


def test_device_id() -> None:
    assert device_id("node1", 0) == "node1-mthreads-0"  # HAMi GetNodeDevices ID
    assert CardGrant("node1-mthreads-3", 512, 1).index == 3
    assert CardGrant("gpu-mthreads-node-mthreads-12", 512, 1).index == 12  # node names may contain the word


def test_hami_example_two_containers_first_with_a_slice() -> None:
    # Reference §6: "2-container pod, first uses a slice: node1-mthreads-3,Mthreads,16384,8:;;"
    value = "node1-mthreads-3,Mthreads,16384,8:;;"
    containers = [[CardGrant("node1-mthreads-3", 16384, 8)], []]
    assert encode_allocation(containers) == value
    assert decode_allocation(value) == containers
    assert gpu_index(containers) == "3"


def test_encoding_of_multi_card_and_empty_containers() -> None:
    containers = [[], [g("n-mthreads-0", 96, 16), g("n-mthreads-1", 96, 16)]]
    value = ";n-mthreads-0,Mthreads,49152,16:n-mthreads-1,Mthreads,49152,16:;"
    assert encode_allocation(containers) == value
    assert decode_allocation(value) == containers
    assert encode_allocation([[]]) == ";"  # an empty container is a bare ";"
    assert decode_allocation(";") == [[]]


def test_hami_patch_annotations_test_re_expressed() -> None:
    # HAMi Test_PatchAnnotations encodes {UUID "test1", Usedmem 1000, Usedcores 1} as
    # "test1,Mthreads,1000,1:;".
    # The encoder is the same; the decoder is stricter on purpose: "test1" is no <node>-mthreads-<i> id and
    # 1000 MiB is no whole number of 512 MiB units, so such a record could not have come from a card.
    assert encode_allocation([[CardGrant("test1", 1000, 1)]]) == "test1,Mthreads,1000,1:;"
    with pytest.raises(AnnotationError):
        decode_allocation("test1,Mthreads,1000,1:;")
    assert gpu_index([[g("test-mthreads-0", 2, 1)]]) == "0"  # mthreads.com/gpu-index = "0"


@pytest.mark.parametrize(
    ("containers", "index"),
    [
        ([[g("n-mthreads-3", 32, 8)], []], "3"),
        ([[g("n-mthreads-0", 96, 16), g("n-mthreads-1", 96, 16)]], "0,1"),  # HAMi: "0,1" for two cards
        ([[g("n-mthreads-2", 8, 1)], [g("n-mthreads-5", 8, 1)]], "5"),  # the last non-empty container wins
        ([[g("n-mthreads-5", 8, 1)], [g("n-mthreads-2", 8, 1)], []], "2"),
        ([[g("n-mthreads-1", 96, 16), g("n-mthreads-0", 96, 16)]], "1,0"),  # grant order, not sorted
        ([[], []], ""),
    ],
)
def test_gpu_index_rule(containers: list[list[CardGrant]], index: str) -> None:
    assert gpu_index(containers) == index


@pytest.mark.parametrize(
    "value",
    [
        "",  # no containers at all
        "garbage",
        "n-mthreads-0,Mthreads,512,1:",  # missing the container ';'
        "n-mthreads-0,Mthreads,512,1;",  # missing the device ':'
        "n-mthreads-0,Mthreads,512,1::;",  # empty device entry
        ":;",
        "n-mthreads-0,NVIDIA,512,1:;",  # wrong device type
        "n-mthreads-0,mthreads,512,1:;",  # type is case-sensitive
        "n-mthreads-0,Mthreads,512:;",  # 3 fields
        "n-mthreads-0,Mthreads,512,1,0:;",  # 5 fields
        "n-gpu-0,Mthreads,512,1:;",  # not <node>-mthreads-<index>
        "-mthreads-0,Mthreads,512,1:;",  # no node name
        "n-mthreads-x,Mthreads,512,1:;",
        "n-mthreads-0,Mthreads,-512,1:;",
        "n-mthreads-0,Mthreads,+512,1:;",
        "n-mthreads-0,Mthreads,0,1:;",  # no memory
        "n-mthreads-0,Mthreads,1000,1:;",  # not a multiple of 512 MiB
        "n-mthreads-0,Mthreads,512.0,1:;",
        "n-mthreads-0,Mthreads,16Gi,1:;",
        "n-mthreads-0,Mthreads,512,17:;",  # more than 16 core groups
        "n-mthreads-0,Mthreads,512,-1:;",
        "n-mthreads-0,Mthreads, 512,1:;",
        "n-mthreads-0,Mthreads,512,1:;\n",
        "n-mthreads-0\n,Mthreads,512,1:;",
        "n-mthreads-0,Mthreads,512²,1:;",  # "²".isdigit() is True but int() refuses it
        "n-mthreads-0,Mthreads,512,1²:;",
        "n-mthreads-²,Mthreads,512,1:;",
        "n-mthreads-٣,Mthreads,512,1:;",  # Arabic-Indic 3 would book card 3 under another id
    ],
)
def test_malformed_values_raise_annotation_error(value: str) -> None:
    # HAMi#2958: an undecodable record must never read as "no usage".
    with pytest.raises(AnnotationError):
        decode_allocation(value)


def test_decoding_a_non_string_is_an_annotation_error() -> None:
    with pytest.raises(AnnotationError):
        decode_allocation(None)  # type: ignore[arg-type]


def test_binding_annotations() -> None:
    containers = [[g("n1-mthreads-2", 32, 8)], []]
    now_ns = 1_700_000_000_123_456_789
    assert binding_annotations("n1", containers, now_ns) == {
        ALLOCATED: "n1-mthreads-2,Mthreads,16384,8:;;",
        GPU_INDEX: "2",
        PREDICATE_NODE: "n1",  # a copy of hami.io/vgpu-node
        PREDICATE_TIME: "1700000000123456789",  # UnixNano, as HAMi's PatchAnnotations
        VGPU_NODE: "n1",
        VGPU_TIME: "1700000000",  # unix seconds
        BIND_PHASE: "allocating",  # never "success" for mthreads (no HAMi device plugin)
        BIND_TIME: "1700000000",
    }


# --- usage_from_annotations -----------------------------------------------------------------------


def bound(
    value: str | None,
    *apps: str,
    init: tuple[str, ...] = (),
    node: str | None = "n1",
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    ann = dict(annotations or {})
    if value is not None:
        ann[ALLOCATED] = value
    extra = {"nodeName": node} if node else {}
    return pod(*(ctr(a) for a in apps), init=[ctr(i) for i in init], annotations=ann, **extra)


def test_no_record_no_usage() -> None:
    assert usage_from_annotations(bound(None, "a")) is None


def test_slice_usage() -> None:
    u = usage_from_annotations(bound("n1-mthreads-3,Mthreads,16384,8:;;", "a", "sidecar"))
    assert u == PodUsage("n1", (3,), 32, 8, 1)


def test_exclusive_and_multi_card_usage() -> None:
    assert usage_from_annotations(bound("n1-mthreads-0,Mthreads,81920,16:;", "a")) == PodUsage(
        "n1", (0,), 160, 16, 1
    )
    value = "n1-mthreads-4,Mthreads,49152,16:n1-mthreads-1,Mthreads,49152,16:;"
    assert usage_from_annotations(bound(value, "a")) == PodUsage("n1", (1, 4), 96, 16, 1)


def test_init_containers_peak_app_containers_sum() -> None:
    # init 64 units / 8 cores; apps 16 + 32 units / 4 + 2 cores -> max(48, 64), max(6, 8), 2 slices.
    value = "n1-mthreads-0,Mthreads,32768,8:;n1-mthreads-0,Mthreads,8192,4:;n1-mthreads-0,Mthreads,16384,2:;"
    assert usage_from_annotations(bound(value, "a", "b", init=("setup",))) == PodUsage("n1", (0,), 64, 8, 2)
    # apps above the init peak: the sum counts
    value = "n1-mthreads-0,Mthreads,4096,1:;n1-mthreads-0,Mthreads,16384,4:;n1-mthreads-0,Mthreads,16384,4:;"
    assert usage_from_annotations(bound(value, "a", "b", init=("setup",))) == PodUsage("n1", (0,), 64, 8, 2)
    # only the init container holds the card: one slice while it runs
    value = "n1-mthreads-0,Mthreads,4096,1:;;"
    assert usage_from_annotations(bound(value, "a", init=("setup",))) == PodUsage("n1", (0,), 8, 1, 1)


def test_cards_holding_different_amounts_book_the_largest_on_each() -> None:
    """HAMi v2.10 may put an init container on another card than the app containers (they are placed in separate
    passes): each card is booked with the largest amount any card of the pod holds, never less than it holds
    (tests/redis/test_redteam_hami_migration.py)."""
    value = "n1-mthreads-0,Mthreads,16384,4:;n1-mthreads-1,Mthreads,8192,2:;"
    assert usage_from_annotations(bound(value, "a", init=("setup",))) == PodUsage("n1", (0, 1), 32, 4, 1)
    value = "n1-mthreads-0,Mthreads,1024,1:;n1-mthreads-1,Mthreads,2048,1:;"
    assert usage_from_annotations(bound(value, "a", "b")) == PodUsage("n1", (0, 1), 4, 1, 1)


def test_node_from_vgpu_node_when_not_yet_bound() -> None:
    p = bound("n2-mthreads-1,Mthreads,1024,1:;", "a", node=None, annotations={VGPU_NODE: "n2"})
    assert usage_from_annotations(p) == PodUsage("n2", (1,), 2, 1, 1)


@pytest.mark.parametrize(
    ("p", "needle"),
    [
        (bound("n1-mthreads-0,Mthreads,1024,1:;", "a", "b"), "lists 1 containers, the pod has 2"),
        (bound("n1-mthreads-0,Mthreads,1024,1:;;;", "a", "b"), "lists 3 containers, the pod has 2"),
        (bound("n2-mthreads-0,Mthreads,1024,1:;", "a"), "is not on node 'n1'"),
        (bound("n1-mthreads-0,Mthreads,1024,1:;", "a", node=None), "is not on node ''"),
        (bound(";;", "a", "b"), "names no card"),
        (bound("n1-mthreads-0,Mthreads,1024,1:", "a"), "must end with ';'"),
        (bound("n1-mthreads-0,Mthreads,1000,1:;", "a"), "positive multiple of 512 MiB"),
    ],
)
def test_usage_is_strict(p: dict[str, Any], needle: str) -> None:
    with pytest.raises(AnnotationError) as e:
        usage_from_annotations(p)
    assert needle in str(e.value)
