"""HAMi-compatible pod annotations: the allocation record the vendor device plugin reads.

Encoding of `hami.io/mthreads-vgpu-devices-allocated` (HAMi's EncodePodSingleDevice): per container,
in pod order (init containers first, then app containers), each card as
`<device id>,Mthreads,<memory MiB>,<cores>:`, then `;`. A container without cards is a bare `;`.
Decoding is strict: anything malformed is an AnnotationError, never "no usage".
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shared.domain.lifecycle import APP, footprint, kind_of
from shared.domain.models import CORES_PER_CARD, UNIT_MIB
from shared.domain.shapes import describe

ALLOCATED = "hami.io/mthreads-vgpu-devices-allocated"
GPU_INDEX = "mthreads.com/gpu-index"
PREDICATE_NODE = "mthreads.com/predicate-node"
PREDICATE_TIME = "mthreads.com/predicate-time"
VGPU_NODE = "hami.io/vgpu-node"
VGPU_TIME = "hami.io/vgpu-time"
BIND_PHASE = "hami.io/bind-phase"
BIND_TIME = "hami.io/bind-time"
DEVICE_TYPE = "Mthreads"

MTHREADS_OWNED_KEYS = frozenset({ALLOCATED, GPU_INDEX, PREDICATE_NODE, PREDICATE_TIME,
                                 "hami.io/mthreads-vgpu-devices-to-allocate"})
SCHEDULER_OWNED_KEYS = frozenset(
    {ALLOCATED, GPU_INDEX, PREDICATE_NODE, PREDICATE_TIME, VGPU_NODE, VGPU_TIME, BIND_PHASE, BIND_TIME,
     "hami.io/mthreads-vgpu-devices-to-allocate"})

# Used with fullmatch (a "$" would let a trailing newline through); ASCII digits only: str.isdigit()
# accepts "²", which int() refuses, and \d accepts "٣", which would name card 3 under another id.
# At most 18 digits: int() refuses more than 4300 with a plain ValueError, which is no AnnotationError.
_ID_RE = re.compile(r"(?P<node>.+)-mthreads-(?P<index>[0-9]{1,18})")
_NUM_RE = re.compile(r"[0-9]{1,18}")


class AnnotationError(ValueError):
    """A record that cannot be decoded; the text quotes what it read short (describe): a record is the pod's
    annotation, up to 256 KiB, which whoever may annotate the pod wrote, and the reconciler's rebuild logged it
    whole (quoted in full, one line of up to 1 MiB per such pod: red team)."""


@dataclass(frozen=True)
class CardGrant:
    """One card given to one container."""

    device_id: str
    memory_mib: int
    cores: int

    @property
    def index(self) -> int:
        m = _ID_RE.fullmatch(self.device_id)
        if not m:
            raise AnnotationError(f"device id {describe(self.device_id)} is not <node>-mthreads-<index>")
        return int(m.group("index"))


def device_id(node: str, index: int) -> str:
    return f"{node}-mthreads-{index}"


def encode_allocation(containers: Sequence[Sequence[CardGrant]]) -> str:
    return "".join(
        "".join(f"{g.device_id},{DEVICE_TYPE},{g.memory_mib},{g.cores}:" for g in grants) + ";"
        for grants in containers
    )


def decode_allocation(value: str) -> list[list[CardGrant]]:
    """Inverse of encode_allocation; raises AnnotationError on any malformed part."""
    if not isinstance(value, str) or not value.endswith(";"):
        raise AnnotationError(f"{ALLOCATED}={describe(value)}: must end with ';'")
    out: list[list[CardGrant]] = []
    for part in value[:-1].split(";"):
        grants: list[CardGrant] = []
        if part:
            if not part.endswith(":"):
                raise AnnotationError(f"{ALLOCATED}: container entry {describe(part)} must end with ':'")
            for dev in part[:-1].split(":"):
                fields = dev.split(",")
                if len(fields) != 4 or fields[1] != DEVICE_TYPE:
                    raise AnnotationError(
                        f"{ALLOCATED}: device entry {describe(dev)} is not <id>,Mthreads,<MiB>,<cores>")
                ident, _, mem, cores = fields
                if not _ID_RE.fullmatch(ident) or not _NUM_RE.fullmatch(mem) or not _NUM_RE.fullmatch(cores):
                    raise AnnotationError(f"{ALLOCATED}: device entry {describe(dev)} has a bad id or number")
                mib, core = int(mem), int(cores)
                if mib % UNIT_MIB or mib <= 0 or not 0 <= core <= CORES_PER_CARD:
                    raise AnnotationError(
                        f"{ALLOCATED}: device entry {describe(dev)}: memory must be a positive multiple of "
                        f"{UNIT_MIB} MiB and cores 0..{CORES_PER_CARD}")
                grants.append(CardGrant(ident, mib, core))
        out.append(grants)
    return out


def record_cards(value: object) -> frozenset[int] | None:
    """The card indices an allocation record names, whoever wrote it; None when it cannot be decoded."""
    try:
        return frozenset(g.index for grants in decode_allocation(str(value)) for g in grants)
    except AnnotationError:
        return None


def gpu_index(containers: Sequence[Sequence[CardGrant]]) -> str:
    """`mthreads.com/gpu-index`: card indices of the last container that holds cards (HAMi's rule)."""
    for grants in reversed(containers):
        if grants:
            return ",".join(str(g.index) for g in grants)
    return ""


def binding_annotations(node: str, containers: Sequence[Sequence[CardGrant]], now_ns: int) -> dict[str, str]:
    """Every key written with the Binding, so that a pod is never bound without its record."""
    secs = str(now_ns // 1_000_000_000)
    return {
        ALLOCATED: encode_allocation(containers),
        GPU_INDEX: gpu_index(containers),
        PREDICATE_NODE: node,
        PREDICATE_TIME: str(now_ns),
        VGPU_NODE: node,
        VGPU_TIME: secs,
        BIND_PHASE: "allocating",
        BIND_TIME: secs,
    }


@dataclass(frozen=True)
class PodUsage:
    """What an allocation record books on its node: per card (memory units, cores, slices)."""

    node: str
    cards: tuple[int, ...]
    memory: int
    cores: int
    slices: int


def usage_from_annotations(pod: Mapping[str, object]) -> PodUsage | None:
    """Booking implied by a bound pod's record; None if the pod carries none. Strict."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    assert isinstance(meta, Mapping) and isinstance(spec, Mapping)
    ann = meta.get("annotations") or {}
    assert isinstance(ann, Mapping)
    raw = ann.get(ALLOCATED)
    if raw is None:
        return None
    containers = decode_allocation(str(raw))
    n_init = len(spec.get("initContainers") or [])
    n_all = n_init + len(spec.get("containers") or [])
    if len(containers) != n_all:
        raise AnnotationError(f"{ALLOCATED} lists {len(containers)} containers, the pod has {n_all}")
    node = str(spec.get("nodeName") or ann.get(VGPU_NODE) or "")
    cards: dict[str, None] = {}
    for grants in containers:
        for g in grants:
            if not g.device_id.startswith(f"{node}-mthreads-"):
                raise AnnotationError(f"{ALLOCATED}: device {describe(g.device_id)} is not on node {node!r}")
            cards.setdefault(g.device_id)
    if not cards:
        raise AnnotationError(f"{ALLOCATED}={describe(str(raw))} names no card")
    ids = list(cards)
    per_card: dict[str, tuple[int, int, int]] = {}
    inits = spec.get("initContainers") or []
    kinds = [kind_of(c if isinstance(c, Mapping) else {}, True) for c in inits] + [APP] * (n_all - n_init)
    for ident in ids:  # memory_mib is a whole number of units (decode_allocation checks it)
        # what each container holds on this card; held at once as Kubernetes runs them (lifecycle.py)
        mine = [[g for g in grants if g.device_id == ident] for grants in containers]
        fp = footprint((k, sum(g.memory_mib for g in gs) // UNIT_MIB, sum(g.cores for g in gs), len(gs))
                       for k, gs in zip(kinds, mine, strict=True))
        per_card[ident] = (fp.memory, fp.cores, fp.slices)
    # Our bind puts every container of a pod on the same cards, so their amounts agree. HAMi v2.10 places init
    # containers and app containers in separate passes, each with its one-card rule: an init container (a sidecar
    # too, held for the pod's life) may hold another card than the apps, with other amounts. A booking holds one
    # amount on each of its cards: the largest, never less than any card holds (refused, the record's usage was
    # recovered from gpu-index, the last container's cards only, and the sidecar's card was offered free).
    mem, cores, slices = (max(v[i] for v in per_card.values()) for i in range(3))
    indices = tuple(sorted(CardGrant(i, UNIT_MIB, 0).index for i in ids))
    return PodUsage(node, indices, mem, cores, slices)
