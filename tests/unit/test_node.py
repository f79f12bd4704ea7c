"""Node -> sliced cards (S5000 guide step 3, reference §3 and §13.3)."""

from __future__ import annotations

from typing import Any

import pytest

from shared.domain.models import CardModel
from shared.domain.node import (
    CORDON_ANNOTATION,
    MAX_INST_ANNOTATION,
    SGPU_CORES_LABEL,
    Card,
    Inventory,
    node_inventory,
)
from tests.unit._k8s import cfg, node

C96 = cfg((96,))
C160 = cfg((160,))
MIXED = cfg((96, 160))


def inv(n: dict[str, Any], c: Any = MIXED) -> Inventory:
    return node_inventory(n, c)


def test_guide_example_8_card_s5000() -> None:
    # "mthreads.com/gpu": "8", "mthreads.com/sgpu-core": "128", "mthreads.com/sgpu-memory": "1280"
    # -> 8 sliced cards, 8x16 = 128 core units, 8x160 = 1280 memory units.
    for c in (C160, MIXED):
        i = inv(node("gpu-node", cores=128, memory=1280, gpu=8), c)
        assert i.error == ""
        assert [card.index for card in i.cards] == list(range(8))
        assert [card.id for card in i.cards] == [f"gpu-node-mthreads-{k}" for k in range(8)]
        assert {card.capacity for card in i.cards} == {160}
        assert {card.cores for card in i.cards} == {16}
        assert all(card.model == CardModel(160) and card.healthy and not card.cordoned for card in i.cards)


def test_s4000_node() -> None:
    # Reference §3: S4000 8 sliced cards: sgpu-core=128, sgpu-memory=768 -> 8 devices of 49152 MiB.
    i = inv(node("s4", cores=128, memory=768), C96)
    assert len(i.cards) == 8 and {c.capacity for c in i.cards} == {96}
    assert i.cards[0].capacity * 512 == 49152


def test_hami_get_node_devices_test_re_expressed() -> None:
    # HAMi: node "test" with one sliced card -> ID "test-mthreads-0", Devcore 16, healthy.
    i = inv(node("test", cores=16, memory=96), C96)
    assert i.cards == (Card("test", 0, 96),)
    assert i.cards[0].id == "test-mthreads-0"
    assert i.cards[0].max_slices == 16  # HAMi models Count=100; we model the vendor's max_inst


def test_hami_unit_test_oddity_is_refused() -> None:
    # HAMi's own test feeds sgpu-core=1, sgpu-memory=1 and gets one 8192 MiB card (ceil(1/16) cards, memory
    # spread as if over 16 cores). A real sliced card reports 16 core units: we refuse to guess.
    i = inv(node("test", cores=1, memory=1), C96)
    assert i.cards == () and "not a multiple of 16" in i.error


def test_whole_card_capacity_is_not_ours() -> None:
    # mthreads.com/gpu are whole cards of the vendor plugin; only sgpu-core/16 counts.
    i = inv(node("n", cores=32, memory=320, gpu=8), C160)
    assert len(i.cards) == 2
    assert inv(node("n", gpu=8), C160) == Inventory("n")


@pytest.mark.parametrize(
    ("label", "indices"),
    [
        ("0-2-3", [0, 2, 3]),  # sgpu_km gpu_ids=0,2,3
        ("0,2,3", [0, 2, 3]),
        ("3-0-2", [0, 2, 3]),
        (" 0-2-3 ", [0, 2, 3]),
        ("5-6-7", [5, 6, 7]),
        ("", [0, 1, 2]),  # no ids: total_gpu_num=N binds GPUs 0..N-1
    ],
)
def test_label_gives_physical_indices(label: str, indices: list[int]) -> None:
    i = inv(node("n1", cores=48, memory=480, labels={SGPU_CORES_LABEL: label}))
    assert i.error == ""
    assert [c.index for c in i.cards] == indices
    assert [c.id for c in i.cards] == [f"n1-mthreads-{k}" for k in indices]


def test_no_label_means_contiguous() -> None:
    assert [c.index for c in inv(node("n1", cores=32, memory=192)).cards] == [0, 1]


@pytest.mark.parametrize(
    ("capacity", "labels", "needle"),
    [
        ({"cores": 20, "memory": 96}, {}, "mthreads.com/sgpu-core capacity 20 is not a multiple of 16"),
        ({"cores": "1.5k", "memory": 96}, {}, "mthreads.com/sgpu-core capacity '1.5k' is not a whole number"),
        ({"cores": 128, "memory": 1281}, {}, "capacity 1281 does not divide evenly over 8 sliced cards"),
        ({"cores": 128}, {}, "mthreads.com/sgpu-memory capacity None is missing"),
        ({"cores": 128, "memory": 0}, {}, "is missing or not a whole number"),
        ({"cores": 128, "memory": "80Gi"}, {}, "is missing or not a whole number"),
        # per-card memory of no configured model: 1024/8 = 128
        (
            {"cores": 128, "memory": 1024},
            {},
            "128 units per card (1024/8) is no configured card model; memoryPerCard [96, 160]",
        ),
        # label disagrees with capacity
        (
            {"cores": 48, "memory": 480},
            {SGPU_CORES_LABEL: "0-2"},
            "lists 2 cards but mthreads.com/sgpu-core capacity 48 means 3",
        ),
        ({"cores": 32, "memory": 320}, {SGPU_CORES_LABEL: "0-1-2-3"}, "lists 4 cards"),
        ({"cores": 48, "memory": 480}, {SGPU_CORES_LABEL: "0-0-2"}, "repeats a card id"),
        ({"cores": 48, "memory": 480}, {SGPU_CORES_LABEL: "a-b-c"}, "is not a list of card ids like 0-2-3"),
        ({"cores": 48, "memory": 480}, {SGPU_CORES_LABEL: "0--2"}, "is not a list of card ids"),
        ({"cores": 48, "memory": 480}, {SGPU_CORES_LABEL: "0-2-²"}, "is not a list of card ids"),
        ({"cores": 48, "memory": 480}, {SGPU_CORES_LABEL: "0-2-٣"}, "is not a list of card ids"),
    ],
)
def test_inconsistent_nodes_offer_no_card_and_say_why(
    capacity: dict[str, object], labels: dict[str, str], needle: str
) -> None:
    i = inv(node("bad", labels=labels, **capacity))  # type: ignore[arg-type]
    assert i.cards == ()
    assert needle in i.error


@pytest.mark.parametrize(("c", "memory"), [(C96, 1280), (C160, 768)])
def test_per_card_memory_not_configured(c: Any, memory: int) -> None:
    # The guide warns that an unset memoryPerCard models S5000 cards as 96 units (48 GiB); we refuse the
    # node instead of handing out a wrong size, and the reason names the list to fix.
    i = inv(node("n", cores=128, memory=memory), c)
    assert i.cards == () and "is no configured card model" in i.error


@pytest.mark.parametrize("cores", [None, 0, "0", "00", " 0 ", ""])
def test_nodes_without_sliced_cards_are_not_an_error(cores: object) -> None:
    i = inv(node("cpu", cores=cores, memory=0))
    assert i == Inventory("cpu")


def test_max_inst_per_node() -> None:
    assert {c.max_slices for c in inv(node("n", cores=32, memory=320)).cards} == {16}
    assert {
        c.max_slices for c in inv(node("n", cores=32, memory=320), cfg((160,), max_slices_per_card=4)).cards
    } == {4}
    i = inv(node("n", cores=32, memory=320, annotations={MAX_INST_ANNOTATION: "8"}))
    assert {c.max_slices for c in i.cards} == {8}


@pytest.mark.parametrize("raw", ["0", "17", "x", "-1", "1.5"])
def test_max_inst_outside_vendor_range(raw: str) -> None:
    # /proc/sgpu_km max_inst: 1-16
    i = inv(node("n", cores=32, memory=320, annotations={MAX_INST_ANNOTATION: raw}))
    assert i.cards == () and "outside 1..16" in i.error


@pytest.mark.parametrize(
    ("value", "cordoned"),
    [
        ("n-mthreads-1, ", {1}),  # HAMi TestFit_DeviceCordon: "dev-1, "
        ("n-mthreads-0,n-mthreads-1", {0, 1}),
        ("", set()),
        ("   ", set()),
        ("other-mthreads-0", set()),
    ],
)
def test_cordon_annotation(value: str, cordoned: set[int]) -> None:
    i = inv(node("n", cores=32, memory=320, annotations={CORDON_ANNOTATION: value}))
    assert {c.index for c in i.cards if c.cordoned} == cordoned
    assert len(i.cards) == 2
