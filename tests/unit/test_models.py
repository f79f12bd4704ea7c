"""Card models and the valid sgpu-memory lists (seed "Card specifications" table, HAMi#2988)."""

from __future__ import annotations

import pytest

from shared.domain.models import (
    CORES_PER_CARD,
    DEFAULT_MAX_INST,
    UNIT_MIB,
    CardModel,
    ModelError,
    describe_models,
    parse_memory_per_card,
    union_memory_values,
    valid_memory_values,
)

# Seed tables, verbatim: mthreads-sharing-s4000-s5000.txt "Card specifications" and the S5000 guide.
S4000_VALID = (2, 4, 8, 16, 32, 64, 96)
S5000_VALID = (2, 4, 8, 16, 32, 64, 128, 160)


def test_constants_match_the_seeds() -> None:
    assert CORES_PER_CARD == 16  # "Both card models expose 16 core groups per card"
    assert UNIT_MIB == 512  # "Device memory is requested in 512 MiB units"
    assert DEFAULT_MAX_INST == 16  # sgpu_km max_inst 1-16, ClusterConfig example "16"


@pytest.mark.parametrize(
    ("capacity", "expected"),
    [
        (96, S4000_VALID),  # MTT S4000, 48 GiB
        (160, S5000_VALID),  # MTT S5000, 80 GiB
    ],
)
def test_valid_memory_per_model_is_the_seed_table(capacity: int, expected: tuple[int, ...]) -> None:
    assert valid_memory_values(capacity) == expected
    assert CardModel(capacity).valid_memory == expected


@pytest.mark.parametrize(
    ("capacity", "expected"),
    [
        # HAMi#2988 rule: powers of two 2 <= v < C, then C itself (the two seed rows are its only examples).
        (64, (2, 4, 8, 16, 32, 64)),  # C is itself a power of two: listed once
        (128, (2, 4, 8, 16, 32, 64, 128)),
        (100, (2, 4, 8, 16, 32, 64, 100)),
        (2, (2,)),
        (3, (2, 3)),
    ],
)
def test_valid_memory_rule_for_other_capacities(capacity: int, expected: tuple[int, ...]) -> None:
    assert valid_memory_values(capacity) == expected


def test_mixed_fleet_admits_the_union() -> None:
    # Reference §13.4: with [96, 160] the union [2,4,8,16,32,64,96,128,160] is admitted.
    models = parse_memory_per_card([96, 160])
    assert union_memory_values(models) == (2, 4, 8, 16, 32, 64, 96, 128, 160)
    assert union_memory_values(parse_memory_per_card([96])) == S4000_VALID
    assert union_memory_values(parse_memory_per_card([160])) == S5000_VALID


@pytest.mark.parametrize(
    ("memory", "s4000", "s5000"),
    [
        (2, True, True),
        (32, True, True),
        (64, True, True),
        (96, True, False),  # 96 is S4000's full card, not an S5000 slice size
        (128, False, True),  # "larger slices (e.g. 128 units) are rejected" on a 96-unit card
        (160, False, True),
        (1, False, False),
        (3, False, False),
        (48, False, False),
        (192, False, False),
    ],
)
def test_accepts(memory: int, s4000: bool, s5000: bool) -> None:
    assert CardModel(96).accepts(memory) is s4000
    assert CardModel(160).accepts(memory) is s5000


def test_model_names_and_sizes() -> None:
    assert CardModel(96).name == "MTT S4000"
    assert CardModel(160).name == "MTT S5000"
    assert CardModel(100).name == "100-unit card"
    assert CardModel(96).memory_gib == 48  # "MTT S4000  48 GiB  96"
    assert CardModel(160).memory_gib == 80  # "MTT S5000  80 GiB  160"
    assert CardModel(96) < CardModel(160)  # ordered by capacity: max() = largest model


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, (96,)),  # chart default [96] = MTT S4000
        ([96], (96,)),
        ([160], (160,)),  # S5000 guide values.yaml
        ([96, 160], (96, 160)),  # mixed fleet, no separate node pools
        ([160, 96], (96, 160)),  # order does not matter
        ([96, 160, 96], (96, 160)),  # duplicates collapse
        (160, (160,)),  # legacy scalar -> one-item list (chart README)
        ("160", (160,)),  # env / flag string
        ("96,160", (96, 160)),
        (" 96 , 160 ", (96, 160)),
        ("[96, 160]", (96, 160)),
        (["96", "160"], (96, 160)),
        ((96, 160), (96, 160)),
        # a whole float: a Helm values file reads 96 as 96.0, so the chart cannot tell them apart and takes both
        ([96.0], (96,)),
        (None, (96,)),  # unset: the default
    ],
)
def test_parse_memory_per_card(value: object, expected: tuple[int, ...]) -> None:
    assert tuple(m.memory for m in parse_memory_per_card(value)) == expected


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ([], "empty"),
        ("", "empty"),
        ("[]", "empty"),
        ([0], "out of range"),
        ([1], "out of range"),
        ([-96], "out of range"),
        ("-1", "out of range"),
        ([4097], "out of range"),
        (["abc"], "not a whole number"),
        ("96;160", "not a whole number"),
        ([96.5], "not a whole number"),
        ("96.0", "not a whole number"),  # written, a number is digits only
        ("9 6", "not a whole number"),  # (int() would read these three as 96)
        ("9_6", "not a whole number"),
        ("+96", "not a whole number"),
        ([True], "not a whole number"),  # YAML `yes`
        (True, "not a whole number"),
        ({"s5000": 160}, "not a whole number"),
        ([[160]], "not a whole number"),
    ],
)
def test_invalid_memory_per_card_is_a_clear_error(value: object, needle: str) -> None:
    with pytest.raises(ModelError) as e:
        parse_memory_per_card(value)
    assert "memoryPerCard" in str(e.value)
    assert needle in str(e.value)


def test_out_of_range_message_names_both_models() -> None:
    with pytest.raises(ModelError, match=r"96 = MTT S4000 48 GiB, 160 = MTT S5000 80 GiB"):
        parse_memory_per_card([5000])


def test_describe_models() -> None:
    assert describe_models(parse_memory_per_card([160, 96])) == "[96, 160]"
    assert describe_models(()) == "[]"
