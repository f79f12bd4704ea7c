"""Card models: what a Moore Threads card offers and which slice sizes it accepts.

A card model is identified by its per-card memory in 512 MiB units (96 = MTT S4000,
160 = MTT S5000), exactly as `devices.mthreads.memoryPerCard` lists them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

CORES_PER_CARD = 16  # sgpu-core units per card: both models expose 16 core groups
UNIT_MIB = 512  # one sgpu-memory unit
DEFAULT_MAX_INST = 16  # vendor sgpu_km max_inst default: slice instances per card
MAX_MODEL_UNITS = 4096  # 2 TiB per card: anything above is a typo, not a card

KNOWN_NAMES = {96: "MTT S4000", 160: "MTT S5000"}
DEFAULT_MODEL = 96  # memoryPerCard unset (or null): MTT S4000, the chart's default too
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


# A whole number as the chart's helper reads one (deploy/helm/hami/templates/_helpers.tpl, hami.memoryPerCard): ASCII
# digits only. int() would also read "9_6", "+96" and other scripts' digits, which the chart refuses.
_WHOLE_RE = re.compile(r"^-?[0-9]+$")


# The blanks the chart's `trim` (Go's strings.TrimSpace) takes off: Python's str.strip() also takes the control
# characters \x1c-\x1f, which the chart keeps (and then refuses the entry)
_BLANKS = "".join(c for c in map(chr, range(0x3001)) if c.isspace() and c not in "\x1c\x1d\x1e\x1f")


def _unquoted(text: str) -> str:
    """The text trimmed, without one pair of matching quotes around it (`--set x={96,"160"}` keeps them); quotes
    around a line break are kept, as the chart's helper keeps them (its regexp's `.` matches no newline)."""
    text = text.strip(_BLANKS)
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'" and "\n" not in text:
        text = text[1:-1].strip(_BLANKS)
    return text


def _units(item: object) -> int:
    """One entry: a whole number, typed or written (a whole float too: a Helm values file reads 96 as 96.0)."""
    if isinstance(item, float) and item.is_integer():
        return int(item)
    if isinstance(item, int) and not isinstance(item, bool):
        return item
    if isinstance(item, str) and _WHOLE_RE.match(_unquoted(item)):
        return int(_unquoted(item))
    raise ModelError(f"memoryPerCard entry {item!r} is not a whole number of 512 MiB units{ALLOWED}")


def parse_memory_per_card(value: object) -> tuple[CardModel, ...]:
    """Read `memoryPerCard`: a list, a legacy scalar (one model), or a comma string from env/flags ("96,160",
    "[96, 160]"; blank pieces are skipped); None is the default. The rule the chart's helper follows too
    (tests/deploy/test_memory_per_card_agreement.py holds them to one table). Models come sorted, each once."""
    if value is None:
        return (CardModel(DEFAULT_MODEL),)
    items: list[object]
    if isinstance(value, str):
        body = _unquoted(value).removeprefix("[").removesuffix("]")
        items = [p.strip(_BLANKS) for p in body.split(",") if p.strip(_BLANKS)]
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        items = [value]
    if not items:
        raise ModelError("memoryPerCard is empty: list at least one card model, e.g. [96] or [96, 160]")
    models: list[CardModel] = []
    for item in items:
        units = _units(item)
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
