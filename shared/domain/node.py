"""From a Node (Kubernetes JSON) to its sliced cards.

The Moore Threads device plugin reports no per-card annotation: sliced cards = sgpu-core capacity
/ 16, memory per card = sgpu-memory / cards, physical indices from the label
`mthreads.com/sgpu.cores` (e.g. `0-2-3`). A node whose numbers disagree offers no card and
carries a reason (fail closed): we never guess which card has what.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from shared.config import Config
from shared.domain.annotations import device_id
from shared.domain.knobs import ANNOTATION as KNOBS_ANNOTATION
from shared.domain.knobs import MAX_CARD_INDEX, CardKnobs, KnobError, KnobReport, decode_annotation
from shared.domain.models import CORES_PER_CARD, DEFAULT_MAX_INST, CardModel, describe_models
from shared.domain.shapes import describe

SGPU_CORES_LABEL = "mthreads.com/sgpu.cores"
MAX_INST_ANNOTATION = "mtsched.io/max-inst"  # per-node override of slices per card (vendor max_inst)
CORDON_ANNOTATION = "hami.io/device-cordon"  # comma list of device ids taken out of service


@dataclass(frozen=True)
class Card:
    node: str
    index: int
    capacity: int  # memory units (the card model)
    max_slices: int = DEFAULT_MAX_INST
    healthy: bool = True
    cordoned: bool = False
    cores: int = CORES_PER_CARD
    knobs: CardKnobs | None = None  # what the node agent read from /proc/sgpu_km (None: not published)

    @property
    def id(self) -> str:
        return device_id(self.node, self.index)

    @property
    def health(self) -> str:
        """The one word the ledger stores (ok | cordoned | unhealthy): a sick card is sick first, so a card
        both unhealthy and cordoned reads back as unhealthy, the reason card_rule gives for it anyway."""
        return "unhealthy" if not self.healthy else ("cordoned" if self.cordoned else "ok")

    @property
    def model(self) -> CardModel:
        return CardModel(self.capacity)


MODEL_MISMATCH = "model"  # per-card memory is no configured card model (an S5000 under memoryPerCard [96])
LABEL_MISMATCH = "label"  # the mthreads.com/sgpu.cores label disagrees with the capacity (or is malformed)
CAPACITY_MISMATCH = "capacity"  # sgpu-core / sgpu-memory capacities are not whole or do not divide
ANNOTATION_MISMATCH = "annotation"  # mtsched.io/max-inst out of range, or the node agent's card-knobs unreadable
MISMATCH_KINDS = (MODEL_MISMATCH, LABEL_MISMATCH, CAPACITY_MISMATCH, ANNOTATION_MISMATCH)
_WHAT = {CAPACITY_MISMATCH: "capacity", LABEL_MISMATCH: "sgpu.cores label", MODEL_MISMATCH: "card model",
         ANNOTATION_MISMATCH: "card annotations"}


def mismatch_causes(errors: Iterable[str]) -> str:
    """What these nodes' errors say is wrong, in words, for a summary line: "sgpu.cores label or card model
    disagrees with the configuration", "card annotations cannot be read", or both joined (only the kinds
    present, so a message about an unreadable annotation never blames a label)."""
    kinds = {mismatch_kind(e) for e in errors}
    disagree = [_WHAT[k] for k in (CAPACITY_MISMATCH, LABEL_MISMATCH, MODEL_MISMATCH) if k in kinds]
    parts = []
    if disagree:
        parts.append(" or ".join(disagree) + " disagrees with the configuration")
    if ANNOTATION_MISMATCH in kinds:
        parts.append(f"{_WHAT[ANNOTATION_MISMATCH]} cannot be read or are out of range")
    return "; ".join(parts) or "they offer no card"


@dataclass(frozen=True)
class Inventory:
    node: str
    cards: tuple[Card, ...] = ()
    error: str = ""  # non-empty: the node offers no card, and this says why
    problem: str = ""  # which kind of mismatch the error is (one of MISMATCH_KINDS; mismatch_kind(error))


def mismatch_kind(error: str) -> str:
    """The kind of a node_inventory error from its text alone (what the ledger and the mirrors keep of it);
    "" for any other error (e.g. a quarantine while unaccounted pods hold cards). tests/unit prove it
    agrees with Inventory.problem for every error node_inventory writes."""
    if not error:
        return ""
    # by how each text begins: the annotations' texts may quote what their writer chose, anything
    if error.startswith(f"label {SGPU_CORES_LABEL}="):
        return LABEL_MISMATCH
    if error.startswith((f"annotation {MAX_INST_ANNOTATION}=", f"annotation {KNOBS_ANNOTATION}")):
        return ANNOTATION_MISMATCH
    if re.match(r"[0-9]+ units per card \([0-9]+/[0-9]+\) is no configured card model; memoryPerCard ", error):
        return MODEL_MISMATCH
    if re.match(r"^\S+ capacity ", error):
        return CAPACITY_MISMATCH
    return ""


MAX_ERROR_BYTES = 2048  # of a node's error, which the ledger keeps (its scripts take at most 4096 bytes)


def _bad(name: str, problem: str, error: str) -> Inventory:
    """A node offering no card; every error node_inventory writes passes here, cut to fit the ledger."""
    return Inventory(name, error=_cut(error), problem=problem)


def _cut(text: str) -> str:
    """`text` cut to MAX_ERROR_BYTES of UTF-8, saying how long it was."""
    raw = text.encode()
    if len(raw) <= MAX_ERROR_BYTES:
        return text
    return f"{raw[:MAX_ERROR_BYTES].decode(errors='ignore')}... ({len(text)} characters)"


def _int_quantity(raw: object) -> int | None:
    # at most 19 digits (any 64-bit quantity): int() refuses more than 4300 with a ValueError, not a None
    text = str(raw).strip()
    return int(text) if re.fullmatch(r"[0-9]{1,19}", text) else None


_DECIMAL_SI = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}


def _status_quantity(raw: object) -> int | None:
    """A whole number of a Node's capacity or allocatable as the API server writes a count: the kubelet's device
    counts are canonical DecimalSI quantities, so 4000 reads "4k" (a 25-card S5000 node's sgpu-memory; was read as
    no whole number, the node closed). Any other form (a fraction, an exponent, a binary suffix: bytes, "80Gi") is
    none: None."""
    m = re.fullmatch(r"([0-9]{1,19})([kMGTPE]?)", str(raw).strip())
    if m is None:
        return None
    value = int(m.group(1)) * _DECIMAL_SI[m.group(2)]
    return value if value < 2**63 else None


def node_inventory(node: Mapping[str, Any], cfg: Config) -> Inventory:
    meta = node.get("metadata") or {}
    name = str(meta.get("name", ""))
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    capacity = (node.get("status") or {}).get("capacity") or {}
    raw_cores = capacity.get(cfg.resource_core_name)
    if raw_cores is None or str(raw_cores).strip() in ("", "0"):
        return Inventory(name)  # no sliced cards: not an error, just not ours
    cores = _status_quantity(raw_cores)
    mem = _status_quantity(capacity.get(cfg.resource_memory_name, ""))
    if cores is None:
        return _bad(name, CAPACITY_MISMATCH, f"{cfg.resource_core_name} capacity {raw_cores!r} is not a whole number")
    if cores == 0:
        return Inventory(name)  # "00" and the like: still no sliced cards (and no division by zero below)
    if cores % CORES_PER_CARD:
        return _bad(name, CAPACITY_MISMATCH, f"{cfg.resource_core_name} capacity {cores} is not a multiple of "
                                     f"{CORES_PER_CARD} (cores per card)")
    n = cores // CORES_PER_CARD
    if n > MAX_CARD_INDEX + 1:  # checked before any list of them is made (10**16 cards: a MemoryError)
        # the ledger holds at most 1024 cards a node (its scripts refuse more): a node written with more failed
        # the node watcher's every re-list on it, and no node listed after it was ever written again
        return _bad(name, CAPACITY_MISMATCH, f"{cfg.resource_core_name} capacity {cores} means {n} sliced cards; "
                                     f"a node has at most {MAX_CARD_INDEX + 1}")
    if mem is None or mem == 0:
        return _bad(name, CAPACITY_MISMATCH, f"{cfg.resource_memory_name} capacity "
                                     f"{capacity.get(cfg.resource_memory_name)!r} is missing or not a whole "
                                     "number")
    if mem % n:
        return _bad(name, CAPACITY_MISMATCH, f"{cfg.resource_memory_name} capacity {mem} does not divide evenly over "
                                     f"{n} sliced cards")
    per_card = mem // n
    if CardModel(per_card) not in cfg.models:
        return _bad(name, MODEL_MISMATCH, f"{per_card} units per card ({mem}/{n}) is no configured card model; "
                                     f"memoryPerCard {describe_models(cfg.models)}")
    label = labels.get(SGPU_CORES_LABEL)
    if label is None or str(label).strip() == "":
        indices = list(range(n))
    else:
        parts = re.split(r"[-,]", str(label).strip())
        if not all(re.fullmatch(r"[0-9]+", p) for p in parts):  # not isdigit(): "²" passes it, int() fails
            return _bad(name, LABEL_MISMATCH, f"label {SGPU_CORES_LABEL}={label!r} is not a list of card ids "
                                         "like 0-2-3")
        indices = [int(p) for p in parts]
        if any(i > MAX_CARD_INDEX for i in indices):  # (the ledger's scripts refuse them, as the knobs' decoder)
            return _bad(name, LABEL_MISMATCH, f"label {SGPU_CORES_LABEL}={label!r} names a card id above "
                                         f"{MAX_CARD_INDEX}")
        if len(set(indices)) != len(indices):
            return _bad(name, LABEL_MISMATCH, f"label {SGPU_CORES_LABEL}={label!r} repeats a card id")
        if len(indices) != n:
            return _bad(name, LABEL_MISMATCH, f"label {SGPU_CORES_LABEL}={label!r} lists {len(indices)} cards but "
                                         f"{cfg.resource_core_name} capacity {cores} means {n}")
    # slices per card, most specific first: the card's own max_inst (the node agent's annotation: what the
    # vendor module enforces), else the node's mtsched.io/max-inst, else the cluster's maxSlicesPerCard
    max_slices = cfg.max_slices_per_card
    raw_inst = annotations.get(MAX_INST_ANNOTATION)
    if raw_inst is not None:
        inst = _int_quantity(raw_inst)
        if inst is None or not 1 <= inst <= DEFAULT_MAX_INST:
            # a long value is cut: the node's error must fit the ledger (4096 bytes, _lib.lua check_error)
            shown = repr(raw_inst) if len(str(raw_inst)) <= 64 else describe(str(raw_inst))
            return _bad(name, ANNOTATION_MISMATCH, f"annotation {MAX_INST_ANNOTATION}={shown} is outside "
                                         f"1..{DEFAULT_MAX_INST}")
        max_slices = inst
    knobs = KnobReport()
    raw_knobs = annotations.get(KNOBS_ANNOTATION)
    if raw_knobs is not None:
        try:
            knobs = decode_annotation(str(raw_knobs))
        except KnobError as e:  # (it may quote the annotation, which can be 64 KiB: _bad cuts it)
            text = str(e)
            if not text.startswith(f"annotation {KNOBS_ANNOTATION}"):  # one kind, readable from the text alone
                text = f"annotation {KNOBS_ANNOTATION}: {text}"
            return _bad(name, ANNOTATION_MISMATCH, text)
    cordoned = {p.strip() for p in str(annotations.get(CORDON_ANNOTATION, "")).split(",") if p.strip()}
    # The device plugin says a device is sick the one way Kubernetes has: the kubelet counts only healthy devices in
    # allocatable (none while the plugin is not registered); on which card they are it does not say. So the node
    # offers no card, unless the operator cordoned cards (hami.io/device-cordon) that cover every device missing:
    # the others are offered (a card that stays sick would otherwise close its node's healthy cards for good).
    # Checked after every mismatch: those need the operator, and are louder (their event, gauge and admission warning)
    allocatable = (node.get("status") or {}).get("allocatable")
    if isinstance(allocatable, Mapping):
        out = sum(device_id(name, i) in cordoned for i in indices)
        for resource, total, per in ((cfg.resource_core_name, cores, CORES_PER_CARD),
                                     (cfg.resource_memory_name, mem, per_card)):
            raw = allocatable.get(resource)
            healthy = None if raw is None else _status_quantity(raw)
            if raw is not None and (healthy is None or total - healthy > out * per):
                shown = repr(raw) if len(str(raw)) <= 64 else describe(str(raw))
                how = "is not a whole number" if healthy is None else "is below"
                # a cordon entry naming no card of this node (a bare index, another node's id) cordons nothing:
                # said here, where the operator who wrote it looks (event, filter reason, explain)
                # (each as written when it is printable, else quoted: any writer of the Node's annotations chose it,
                # and a line break or a terminal escape printed raw forged rows of `mtsched cards`: red team)
                stray = ", ".join(e if e.isprintable() else repr(e)
                                  for e in sorted(cordoned - {device_id(name, i) for i in indices}))
                hint = (f"; {CORDON_ANNOTATION} entries naming no card of this node: "
                        f"{stray if len(stray) <= 64 else describe(stray)} (its cards are named like "
                        f"{device_id(name, min(indices))})") if stray and indices else ""
                return _bad(name, "", f"{resource} allocatable {shown} {how} (capacity {total}): the device "
                                      "plugin reports devices unhealthy (or is not registered) and not on which "
                                      "card; no card is offered until they are healthy again, or cards that "
                                      f"cover them are cordoned (annotation {CORDON_ANNOTATION}){hint}")
    cards = []
    for i in sorted(indices):
        k = knobs.cards.get(i)
        cards.append(Card(name, i, per_card, k.max_inst if k else max_slices,
                          cordoned=device_id(name, i) in cordoned, knobs=k))
    return Inventory(name, tuple(cards))


def offers_more(before: Inventory | None, after: Inventory | None) -> bool:
    """Whether `after` offers a pod room `before` did not: a bookable card (healthy, not cordoned) that was not
    bookable or not there, or one with more memory, cores or slices. After such a change a pod our filter turned
    away may fit, and kube-scheduler retries it only on a cluster event (controller/nudger.py nudges it)."""
    if after is None or after.error:
        return False
    was = {} if before is None or before.error else {c.index: c for c in before.cards}
    for card in after.cards:
        if not card.healthy or card.cordoned:
            continue
        old = was.get(card.index)
        if (old is None or not old.healthy or old.cordoned or card.capacity > old.capacity or card.cores > old.cores
                or card.max_slices > old.max_slices):
            return True
    return False
