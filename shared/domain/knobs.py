"""The card knobs of the vendor's sgpu_km module, as the node agent reads and publishes them.

`/proc/sgpu_km/<card>/` holds, per sliced card (the directory is named by the card's index, the
number `gpu_ids=` and the `mthreads.com/sgpu.cores` label use): `max_inst` (1..16 slice instances),
`policy` (0 performance, 1 weak isolation, 2 strong isolation), `time_slice` (ms, >= 1) and
`overcommit_ratio` (memory overcommit in percent, 100..200). The node agent turns the file texts
into one node annotation, `mtsched.io/card-knobs`, with a versioned JSON value; the scheduler reads
it back with `decode_annotation`. Both directions are strict: a value that is not exactly a whole
number in range is an error naming the card, the knob, the value and what is allowed; a card whose
knobs cannot be read is published as unreadable (with why), never with guessed values.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import orjson

from shared.domain.models import DEFAULT_MAX_INST

ANNOTATION = "mtsched.io/card-knobs"
VERSION = 1
# 1024 cards at their widest knobs encode to ~79 KB (78,779 bytes); the API server takes 256 KiB of annotations
# per object
MAX_ANNOTATION_BYTES = 128 * 1024
MAX_CARD_INDEX = 1023

# knob -> (lowest, highest) whole number accepted; the order is the order of the annotation's fields
RANGES: dict[str, tuple[int, int]] = {
    "max_inst": (1, DEFAULT_MAX_INST),
    "policy": (0, 2),
    "time_slice": (1, 1_000_000),  # ms; the vendor documents a minimum of 1 and no maximum
    "overcommit_ratio": (100, 200),  # percent (ClusterConfig's 1.1 is 110 here)
}
KNOBS = tuple(RANGES)
# The knobs the vendor module refuses to change while a container holds an allocation on the card.
FROZEN_WHILE_HELD = ("max_inst", "policy", "time_slice")
POLICY_NAMES = {0: "performance", 1: "weak", 2: "strong"}
_INT = re.compile(r"[0-9]{1,9}")
_CARD = re.compile(r"0|[1-9][0-9]{0,3}")  # canonical only: "00" and "0" would name one card twice


class KnobError(ValueError):
    """A knob file or an annotation that does not say what the rules need, with why."""


@dataclass(frozen=True)
class CardKnobs:
    max_inst: int
    policy: int
    time_slice: int
    overcommit_ratio: int  # percent

    def as_json(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in KNOBS}

    def describe_policy(self) -> str:
        """"strong, 2 ms": the time slice matters only under weak and strong isolation."""
        name = POLICY_NAMES[self.policy]
        return name if self.policy == 0 else f"{name}, {self.time_slice} ms"


@dataclass(frozen=True)
class KnobReport:
    """What one node's agent found: cards with their knobs, cards it could not read (card -> why), and an
    error for the whole tree (e.g. the module is not loaded)."""

    cards: Mapping[int, CardKnobs] = field(default_factory=dict)
    unreadable: Mapping[str, str] = field(default_factory=dict)
    error: str = ""


def parse_knob(where: str, knob: str, text: str) -> int:
    """One knob file's text (a decimal number; whitespace around it, such as the closing newline, is ignored) as
    a whole number."""
    lo, hi = RANGES[knob]
    value = text.strip()
    if not _INT.fullmatch(value) or not lo <= int(value) <= hi:
        raise KnobError(f"{where}/{knob}: {value[:40]!r} is not a whole number {lo}..{hi}")
    return int(value)


def parse_card(where: str, texts: Mapping[str, str]) -> CardKnobs:
    """The four knob files of one card directory (`where` names it in errors)."""
    missing = [k for k in KNOBS if k not in texts]
    if missing:
        raise KnobError(f"{where}: missing {', '.join(missing)}")
    values = {k: parse_knob(where, k, texts[k]) for k in KNOBS}
    return CardKnobs(**values)


def card_index(name: str) -> int:
    if not _CARD.fullmatch(name) or int(name) > MAX_CARD_INDEX:
        raise KnobError(f"{name[:40]!r} is not a card index 0..{MAX_CARD_INDEX} (decimal, no leading zeros)")
    return int(name)


def build_report(root: str, tree: Mapping[str, Mapping[str, str] | str]) -> KnobReport:
    """From what the agent read: card directory -> {knob: file text}, or -> why it could not be read."""
    cards: dict[int, CardKnobs] = {}
    unreadable: dict[str, str] = {}
    for name, texts in sorted(tree.items()):
        try:
            idx = card_index(name)
            if isinstance(texts, str):
                raise KnobError(f"{root}/{name}: {texts}")
            cards[idx] = parse_card(f"{root}/{name}", texts)
        except KnobError as e:
            unreadable[name[:64]] = str(e)[:300]
    return KnobReport(cards, unreadable)


def encode_annotation(report: KnobReport) -> str:
    """The annotation value: `{"v":1,"cards":{"0":{...}},"unreadable":{...}}` (and "error" if any), with
    sorted keys, so the same findings always give the same text and an unchanged node is not patched."""
    doc: dict[str, object] = {"v": VERSION,
                              "cards": {str(i): report.cards[i].as_json() for i in sorted(report.cards)}}
    if report.unreadable:
        doc["unreadable"] = dict(report.unreadable)
    if report.error:
        doc["error"] = report.error
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS).decode()


def _strings(value: object, what: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise KnobError(f"{what} must map names to strings")
    return dict(value)


def _object(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """A JSON object whose keys are all distinct: a repeated key (two readings of one card) is refused."""
    out = dict(pairs)
    if len(out) != len(pairs):
        # in one pass: counting each key again was quadratic, and a node's own annotation (any Node event of it)
        # held the watcher's loop 1.7 s per event with one repeated key among ~10,000 (red team)
        twice = sorted(k for k, n in Counter(k for k, _ in pairs).items() if n > 1)
        raise KnobError(f"annotation {ANNOTATION}: key(s) {', '.join(map(repr, twice[:10]))[:200]} given twice")
    return out


def _no_constant(name: str) -> object:
    raise KnobError(f"annotation {ANNOTATION} is not JSON: {name} is not a number")


class _LongNumber:
    """A JSON integer too long to be any knob, version or index: kept as its length, so the check of the
    field it is in refuses it by name (int() would raise a plain ValueError past 4300 digits)."""

    def __init__(self, text: str):
        self.digits = len(text.lstrip("-"))

    def __repr__(self) -> str:
        return f"<a number of {self.digits} digits>"


def _parse_int(text: str) -> int | _LongNumber:
    return int(text) if len(text) <= 20 else _LongNumber(text)


def _shown(value: object) -> str:
    """A value the annotation's writer chose, as an error quotes it: short, quoted, escaped (it reaches events,
    logs and admission warnings)."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def decode_annotation(raw: str) -> KnobReport:
    """The annotation value as the agent wrote it; KnobError naming the field for anything else."""
    # characters first (cheap), then the bytes the API server counts
    if len(raw) > MAX_ANNOTATION_BYTES or len(raw.encode("utf-8", "surrogatepass")) > MAX_ANNOTATION_BYTES:
        raise KnobError(f"annotation {ANNOTATION} is longer than {MAX_ANNOTATION_BYTES} bytes")
    try:  # the stdlib parser: it shows every key, so a repeated one is refused, not silently the last
        doc = json.loads(raw, object_pairs_hook=_object, parse_constant=_no_constant, parse_int=_parse_int)
    except (json.JSONDecodeError, RecursionError) as e:
        raise KnobError(f"annotation {ANNOTATION} is not JSON: {e}") from e
    if not isinstance(doc, dict):
        raise KnobError(f"annotation {ANNOTATION} must be a JSON object")
    v = doc.get("v")
    if type(v) is not int or v != VERSION:  # true and 1.0 equal 1 in Python; the agent writes the integer
        raise KnobError(f"annotation {ANNOTATION}: format version {_shown(doc.get('v'))} is not {VERSION} "
                        "(the one this scheduler reads)")
    extra = sorted(set(doc) - {"v", "cards", "unreadable", "error"})
    if extra:
        more = f" and {len(extra) - 3} more" if len(extra) > 3 else ""
        raise KnobError(f"annotation {ANNOTATION}: unknown field(s) {', '.join(map(_shown, extra[:3]))}{more} "
                        f"in v{VERSION}")
    cards_doc = doc.get("cards")
    if not isinstance(cards_doc, dict):
        raise KnobError(f"annotation {ANNOTATION}: cards must be an object of card index -> knobs")
    cards: dict[int, CardKnobs] = {}
    for name, knobs in cards_doc.items():
        try:
            idx = card_index(name)
        except KnobError as e:
            raise KnobError(f"annotation {ANNOTATION}: cards: {e}") from e
        if not isinstance(knobs, dict) or set(knobs) != set(KNOBS):
            raise KnobError(f"annotation {ANNOTATION}: card {name} must have exactly {', '.join(KNOBS)}")
        values: dict[str, int] = {}
        for k in KNOBS:
            v, (lo, hi) = knobs[k], RANGES[k]
            if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
                raise KnobError(f"annotation {ANNOTATION}: card {name} {k}={v!r} is not a whole number {lo}..{hi}")
            values[k] = v
        cards[idx] = CardKnobs(**values)
    unreadable = _strings(doc.get("unreadable", {}), f"annotation {ANNOTATION}: unreadable")
    error = doc.get("error", "")
    if not isinstance(error, str):
        raise KnobError(f"annotation {ANNOTATION}: error must be a string")
    return KnobReport(cards, unreadable, error)


@dataclass(frozen=True)
class KnobChange:
    """A knob the vendor refuses to change under held slices that changed on a card holding slices."""

    card: int
    knob: str
    old: int
    new: int
    holders: tuple[str, ...]  # namespace/name of the pods holding the card

    def message(self, node: str) -> str:
        return (f"card {node}-mthreads-{self.card}: {self.knob} changed {self.old} -> {self.new} while "
                f"{len(self.holders)} pod(s) hold slices there ({', '.join(self.holders[:5])}"
                f"{', ...' if len(self.holders) > 5 else ''}); the sgpu_km module refuses such a change "
                "while a card holds allocations: drain the card first")


def held_changes(old: Mapping[int, CardKnobs], new: Mapping[int, CardKnobs],
                 holders: Mapping[int, Iterable[str]]) -> list[KnobChange]:
    """Changes of max_inst/policy/time_slice between two readings on cards that hold slices (`holders`:
    card index -> pods holding it). A card that appears or disappears is no change of a knob."""
    out: list[KnobChange] = []
    for idx in sorted(set(old) & set(new)):
        pods = tuple(sorted(holders.get(idx, ())))
        if not pods:
            continue
        for knob in FROZEN_WHILE_HELD:
            a, b = getattr(old[idx], knob), getattr(new[idx], knob)
            if a != b:
                out.append(KnobChange(idx, knob, a, b, pods))
    return out


def should_patch(current: str | None, wanted: str) -> bool:
    """The agent patches its node only when the annotation would change."""
    return current != wanted
