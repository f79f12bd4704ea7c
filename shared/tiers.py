"""What a container really gets from the Moore Threads runtime for a granted slice.

The runtime rounds MTHREADS_QOS_MEMORY_LIMIT up to its next tier (512 MiB, then
1/2/4/8/16/32/48/64/80 GiB) and turns sgpu-core into a compute weight. The admission
rules only admit values that are exactly a tier, so nothing is ever rounded; this
module lets the card table and the docs show the enforced numbers.
"""

from __future__ import annotations

from shared.models import CORES_PER_CARD, UNIT_MIB

MEMORY_TIERS_MIB: tuple[int, ...] = (512, *(g * 1024 for g in (1, 2, 4, 8, 16, 32, 48, 64, 80)))


def runtime_memory_limit_mib(units: int) -> int:
    """The memory limit the runtime enforces for `units` sgpu-memory units (rounded up to a tier)."""
    asked = units * UNIT_MIB
    for tier in MEMORY_TIERS_MIB:
        if tier >= asked:
            return tier
    raise ValueError(f"{units} units ({asked} MiB) is above the largest runtime tier (80 GiB)")


def compute_weight(cores: int) -> int:
    """Compute weight (time slices) the runtime sets for `cores` core groups.

    The vendor documents the weight as derived from sgpu-core (1-99999, default 1); we model one
    time slice per core group, which keeps shares proportional: weight / 16 of the card.
    """
    if not 1 <= cores <= CORES_PER_CARD:
        raise ValueError(f"sgpu-core {cores} is outside 1..{CORES_PER_CARD}")
    return cores


def format_mib(mib: int) -> str:
    return f"{mib // 1024} GiB" if mib % 1024 == 0 else f"{mib} MiB"
