"""The runtime's memory tiers (S5000 guide, MTHREADS_QOS_MEMORY_LIMIT) and compute weights."""

from __future__ import annotations

import pytest

from shared.models import UNIT_MIB, CardModel, parse_memory_per_card, union_memory_values
from shared.tiers import MEMORY_TIERS_MIB, compute_weight, format_mib, runtime_memory_limit_mib

GIB = 1024


def test_tiers_are_the_guide_list() -> None:
    # "rounds up to the next tier: 512 MiB, then 1/2/4/8/16/32/48/64/80 GiB"
    assert MEMORY_TIERS_MIB == (
        512,
        1 * GIB,
        2 * GIB,
        4 * GIB,
        8 * GIB,
        16 * GIB,
        32 * GIB,
        48 * GIB,
        64 * GIB,
        80 * GIB,
    )


@pytest.mark.parametrize("capacity", [96, 160])
def test_every_valid_value_is_exactly_a_tier(capacity: int) -> None:
    # The admission lists only admit values the runtime enforces as asked: nothing is ever rounded.
    for units in CardModel(capacity).valid_memory:
        assert units * UNIT_MIB in MEMORY_TIERS_MIB
        assert runtime_memory_limit_mib(units) == units * UNIT_MIB


def test_mixed_union_covers_every_tier_but_512_mib() -> None:
    # Reference §16: "their union = all tiers except 512 MiB".
    union = union_memory_values(parse_memory_per_card([96, 160]))
    assert sorted(u * UNIT_MIB for u in union) == list(MEMORY_TIERS_MIB[1:])


@pytest.mark.parametrize(
    ("units", "mib"),
    [
        (32, 16384),  # seed: 32 units = 16 GiB, mthreads-gmi shows 0MiB(16384MiB)
        (96, 48 * GIB),  # a whole S4000 card
        (160, 80 * GIB),  # a whole S5000 card
        (2, 1 * GIB),
        (1, 512),  # the smallest tier
        # Off-list values (only reachable when admission is bypassed) round UP to the next tier:
        (3, 2 * GIB),  # 1.5 GiB -> 2 GiB
        (5, 4 * GIB),
        (33, 32 * GIB),  # 16.5 GiB -> 32 GiB
        (65, 48 * GIB),  # 32.5 GiB -> 48 GiB
        (97, 64 * GIB),  # 48.5 GiB -> 64 GiB
        (129, 80 * GIB),  # 64.5 GiB -> 80 GiB
        (0, 512),
    ],
)
def test_runtime_memory_limit(units: int, mib: int) -> None:
    assert runtime_memory_limit_mib(units) == mib
    assert runtime_memory_limit_mib(units) >= units * UNIT_MIB  # never below what was booked


def test_exclusive_s5000_limit_in_bytes_matches_hami_2988_verification() -> None:
    # HAMi#2988 author: exclusive vgpu:1 pods on S5000 get MTHREADS_QOS_MEMORY_LIMIT=85899345920 (80 GiB).
    assert runtime_memory_limit_mib(160) * 1024 * 1024 == 85899345920


@pytest.mark.parametrize("units", [161, 192, 1000])
def test_above_the_largest_tier_is_an_error(units: int) -> None:
    with pytest.raises(ValueError, match="80 GiB"):
        runtime_memory_limit_mib(units)


@pytest.mark.parametrize("cores", range(1, 17))
def test_compute_weight_one_slice_per_core_group(cores: int) -> None:
    # Documented choice: weight = sgpu-core, so shares stay proportional (weight / 16 of the card),
    # and it stays inside the vendor range 1-99999.
    assert compute_weight(cores) == cores
    assert 1 <= compute_weight(cores) <= 99999


@pytest.mark.parametrize("cores", [0, 17, -1, 100])
def test_compute_weight_outside_1_to_16(cores: int) -> None:
    with pytest.raises(ValueError, match=r"1\.\.16"):
        compute_weight(cores)


@pytest.mark.parametrize(
    ("mib", "text"),
    [(512, "512 MiB"), (1024, "1 GiB"), (16384, "16 GiB"), (81920, "80 GiB"), (1536, "1536 MiB")],
)
def test_format_mib(mib: int, text: str) -> None:
    assert format_mib(mib) == text
