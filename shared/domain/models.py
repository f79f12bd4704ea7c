"""Card models: what a Moore Threads card offers and which slice sizes it accepts.

A card model is identified by its per-card memory in 512 MiB units (96 = MTT S4000,
160 = MTT S5000), exactly as `devices.mthreads.memoryPerCard` lists them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

CORES_PER_CARD = 16  # sgpu-core units per card: both models expose 16 core groups
UNIT_MIB = 512  # one sgpu-memory unit
DEFAULT_MAX_INST = 16  # vendor sgpu_km max_inst default: slice instances per card
MAX_MODEL_UNITS = 4096  # 2 TiB per card: anything above is a typo, not a card

KNOWN_NAMES = {96: "MTT S4000", 160: "MTT S5000"}
# a known card's memory in GiB, written where its units belong (the seeds give both: 48 GiB = 96 units): no card
# with sGPU has that many units. The chart refuses them with the same words (_helpers.tpl, memoryPerCard)
GIB_WRITTEN = {units // 2: units for units in KNOWN_NAMES}
ALLOWED = f" (2..{MAX_MODEL_UNITS}; 96 = MTT S4000, 160 = MTT S5000: one, or a list such as [96, 160])"


class ModelError(ValueError):
    """A memoryPerCard value that names no possible card."""


def valid_memory_values(capacity: int) -> tuple[int, ...]:
    """Slice sizes a card of `capacity` units accepts: powers of two 2 <= v < C, and C itself."""
    values: list[int] = []
    v = 2
    while v < capacity:
        values.append(v)
        v *= 2
    values.append(capacity)
    return tuple(values)


@dataclass(frozen=True, order=True)
class CardModel:
    memory: int  # units of 512 MiB per card

    @property
    def name(self) -> str:
        return KNOWN_NAMES.get(self.memory, f"{self.memory}-unit card")

    @property
    def memory_gib(self) -> float:
        return self.memory * UNIT_MIB / 1024

    @property
    def valid_memory(self) -> tuple[int, ...]:
        return valid_memory_values(self.memory)

    def accepts(self, memory: int) -> bool:
        return memory in self.valid_memory


def parse_memory_per_card(value: object) -> tuple[CardModel, ...]:
    """Read `memoryPerCard`: a list of ints, a legacy scalar (one model), or a comma string from env/flags."""
    if value is None:
        return (CardModel(96),)
    items: list[object]
    if isinstance(value, str):
        items = [p for p in value.replace(" ", "").strip("[]").split(",") if p]
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        items = [value]
    if not items:
        raise ModelError("memoryPerCard is empty: list at least one card model, e.g. [96] or [96, 160]")
    models: list[CardModel] = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (int, str)):
            raise ModelError(f"memoryPerCard entry {item!r} is not a whole number of 512 MiB units{ALLOWED}")
        try:
            units = int(item)
        except ValueError:
            raise ModelError(f"memoryPerCard entry {item!r} is not a whole number of 512 MiB units{ALLOWED}") from None
        if units in GIB_WRITTEN:
            meant = GIB_WRITTEN[units]
            raise ModelError(f"memoryPerCard entry {units} is {KNOWN_NAMES[meant]}'s memory in GiB; the unit is "
                             f"512 MiB: use {meant} (no Moore Threads card with sGPU has {units} units)")
        if not 2 <= units <= MAX_MODEL_UNITS:
            raise ModelError(
                f"memoryPerCard entry {units} is out of range: a card has 2..{MAX_MODEL_UNITS} units "
                "(96 = MTT S4000 48 GiB, 160 = MTT S5000 80 GiB)"
            )
        if CardModel(units) not in models:
            models.append(CardModel(units))
    return tuple(sorted(models))


def union_memory_values(models: Iterable[CardModel]) -> tuple[int, ...]:
    """What admission accepts: a value valid for any configured model."""
    return tuple(sorted({v for m in models for v in m.valid_memory}))


def describe_models(models: Iterable[CardModel]) -> str:
    return "[" + ", ".join(str(m.memory) for m in models) + "]"
