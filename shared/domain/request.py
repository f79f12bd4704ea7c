"""From a pod (Kubernetes JSON) to what it asks of Moore Threads cards.

Two layers: `read_asks` turns container resources into integer asks (strictly: a bad quantity is
an error naming the container, the resource and the value); `shape_request` applies the sharing
rules of the seeds and returns a SliceRequest, the one thing fitting and booking work from.
Both the webhook (before mutation) and the scheduler (after) use them, so the rules live once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from shared.config import Config
from shared.domain.lifecycle import APP, INIT, SIDECAR, footprint, kind_of
from shared.domain.models import CORES_PER_CARD, KNOWN_NAMES, MAX_MODEL_UNITS, CardModel, describe_models
from shared.domain.quantity import exact, is_zero
from shared.domain.shapes import MAX_QUANTITY_CHARS, describe, pod_problems

MAX_CARDS_PER_POD = 64  # larger than any node; above it the value is a typo
PIN_ANNOTATION = "mtsched.io/card-memory"  # pins exclusive/multi-card pods (and slices) to one card model
_INT_RE = re.compile(r"^\+?[0-9]+$")


class RequestError(ValueError):
    """One or more problems with what a pod asks; each names container, resource and value."""

    def __init__(self, problems: Sequence[str]):
        super().__init__("; ".join(problems))
        self.problems = tuple(problems)


class Mode(StrEnum):
    SLICE = "slice"  # vgpu 1 with a memory value: a share of one card
    EXCLUSIVE = "exclusive"  # vgpu 1 alone: the whole card
    MULTI = "multi"  # vgpu > 1: that many whole cards


@dataclass(frozen=True)
class ContainerAsk:
    """Integer view of one container's mthreads resources (None = not asked)."""

    name: str
    init: bool
    count: int | None
    memory: int | None
    cores: int | None
    whole_gpu: bool
    memory_in_requests_only: bool = False
    cores_in_requests_only: bool = False
    sidecar: bool = False  # an init container with restartPolicy Always: runs beside the apps (lifecycle.py)

    @property
    def asks_slices(self) -> bool:
        return self.count is not None or self.memory is not None or self.cores is not None

    @property
    def kind(self) -> str:
        return SIDECAR if self.sidecar else INIT if self.init else APP

    @property
    def beside_apps(self) -> bool:
        """Runs while the app containers run (an app container or a sidecar)."""
        return not self.init or self.sidecar


@dataclass(frozen=True)
class ContainerShare:
    """What one container holds on each of the pod's cards (units); zero for a container without cards."""

    name: str
    init: bool
    memory: int
    cores: int

    @property
    def empty(self) -> bool:
        return self.memory == 0 and self.cores == 0


@dataclass(frozen=True)
class SliceRequest:
    """What a pod needs: `cards` cards, each booked with memory/cores/slices (pod peak over init and app)."""

    mode: Mode
    cards: int
    memory: int  # units per card; for EXCLUSIVE/MULTI with model None, "the whole card"
    cores: int
    slices: int
    model: int | None  # required card capacity (units), None = any card model
    shares: tuple[ContainerShare, ...]  # init containers first, then app containers (annotation order)

    @property
    def whole_cards(self) -> bool:
        return self.mode is not Mode.SLICE

    def booking_for(self, capacity: int) -> tuple[int, int, int]:
        """(memory, cores, slices) this request books on one card of `capacity` units."""
        if self.whole_cards:
            return capacity, CORES_PER_CARD, 1
        return self.memory, self.cores, self.slices

    def shares_for(self, capacity: int) -> tuple[ContainerShare, ...]:
        if not self.whole_cards:
            return self.shares
        return tuple(
            s if s.empty else ContainerShare(s.name, s.init, capacity, CORES_PER_CARD) for s in self.shares
        )


def parse_quantity(value: object, container: str, resource: str, limit: int) -> int:
    """A whole number 1..limit, else RequestError naming container, resource and value."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        raise RequestError([f'container "{container}": {resource}={describe(value)} is too large; at most {limit}'])
    text = str(value) if not isinstance(value, bool) else "?"
    if len(text) > MAX_QUANTITY_CHARS:  # before any regex or int(): a 5000-digit value is refused, not parsed
        raise RequestError([f'container "{container}": {resource}={describe(value)} is too long; use a whole '
                            f"number 1..{limit}"])
    text = text.strip()
    where = f'container "{container}": {resource}={value!r}'
    milli = re.fullmatch(r"(-?[0-9]+)m", text)
    if milli:  # the API server canonicalises "1.5" to "1500m" before admission: show what was written
        where += f" (= {int(milli.group(1)) / 1000:g})"
    kilo = re.fullmatch(r"\+?([0-9]+)([kMG])", text)
    if kilo:  # the API server writes 4000 as "4k": a whole number all the same
        text = str(int(kilo.group(1)) * {"k": 10**3, "M": 10**6, "G": 10**9}[kilo.group(2)])
    if not _INT_RE.match(text):
        if is_zero(text):  # "-0", "0e99", "0.0": zero however written
            raise RequestError([f"{where} is 0; it must be at least 1 (remove the resource instead of asking for 0)"])
        if re.match(r"^-[0-9]+$", text):
            raise RequestError([f"{where} is negative; use a whole number 1..{limit}"])
        if re.fullmatch(r"\+?[0-9.]+[eE]\+?[0-9]+", text) and exact(text) is None:  # beyond any exponent read
            raise RequestError([f"{where} is too large; at most {limit}"])
        value = exact(text)
        if value is not None and value.denominator == 1:
            # a whole number in another form (a decimal point, an exponent, a unit suffix): the rules read plain
            # integers only, so say what it is and how to write it
            shown = f"{int(value)}" if value <= 10**12 else "more than 10^12"
            raise RequestError([f"{where} is {shown}, written with a decimal point, an exponent or a unit "
                                f"suffix; use a plain integer 1..{limit}"])
        raise RequestError([f"{where} is not a whole number; use a plain integer 1..{limit} "
                            "(no fractions or unit suffixes)"])
    n = int(text)
    if n < 1:
        raise RequestError([f"{where} must be at least 1 (remove the resource instead of asking for 0)"])
    if n > limit:
        raise RequestError([f"{where} is too large; at most {limit}"])
    return n


def _containers(pod: Mapping[str, Any]) -> list[tuple[Mapping[str, Any], bool]]:
    spec = pod.get("spec") or {}
    inits = [(c, True) for c in spec.get("initContainers") or []]
    apps = [(c, False) for c in spec.get("containers") or []]
    return inits + apps


def read_asks(pod: Mapping[str, Any], cfg: Config) -> list[ContainerAsk]:
    """Integer asks of every container (init first), limits read before requests."""
    problems: list[str] = []
    asks: list[ContainerAsk] = []
    max_mem = max(m.memory for m in cfg.models) * MAX_CARDS_PER_POD
    limits_for = {
        cfg.resource_count_name: MAX_CARDS_PER_POD,
        cfg.resource_memory_name: min(max_mem, MAX_MODEL_UNITS * MAX_CARDS_PER_POD),
        cfg.resource_core_name: CORES_PER_CARD * MAX_CARDS_PER_POD,
    }
    for c, init in _containers(pod):
        name = str(c.get("name", "?"))
        res = c.get("resources") or {}
        lim = res.get("limits") or {}
        req = res.get("requests") or {}
        values: dict[str, int | None] = {}
        req_only: dict[str, bool] = {}
        for resource, limit in limits_for.items():
            raw = lim.get(resource, req.get(resource))
            req_only[resource] = resource not in lim and resource in req
            if raw is None:
                values[resource] = None
                continue
            try:
                values[resource] = parse_quantity(raw, name, resource, limit)
            except RequestError as e:
                problems.extend(e.problems)
                values[resource] = None
        whole = cfg.whole_card_resource_name in lim or cfg.whole_card_resource_name in req
        asks.append(ContainerAsk(
            name=name, init=init,
            count=values[cfg.resource_count_name],
            memory=values[cfg.resource_memory_name],
            cores=values[cfg.resource_core_name],
            whole_gpu=whole,
            memory_in_requests_only=req_only[cfg.resource_memory_name],
            cores_in_requests_only=req_only[cfg.resource_core_name],
            sidecar=kind_of(c, init) == SIDECAR,
        ))
    if problems:
        raise RequestError(problems)
    return asks


PIN_ALIASES = {"s4000": "96", "mtt-s4000": "96", "s5000": "160", "mtt-s5000": "160"}  # the card's name for its units


def pinned_model(pod: Mapping[str, Any], cfg: Config) -> CardModel | None:
    """The card model a pod pins with the mtsched.io/card-memory annotation, if any."""
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(PIN_ANNOTATION)
    if raw is None:
        return None
    text = str(raw).strip()
    text = PIN_ALIASES.get(text.lower(), text)
    # isdigit() takes "²"; the length bound keeps int() away from a 5000-digit annotation
    if not re.fullmatch(r"[0-9]{1,9}", text) or CardModel(int(text)) not in cfg.models:
        names = [KNOWN_NAMES[m.memory].removeprefix("MTT ") for m in cfg.models if m.memory in KNOWN_NAMES]
        raise RequestError([f"annotation {PIN_ANNOTATION}={describe(raw)} names no configured card model; "
                            f"allowed: {', '.join(str(m.memory) for m in cfg.models)}"
                            f"{' (or ' + '/'.join(names) + ')' if names else ''}, "
                            f"memoryPerCard {describe_models(cfg.models)}"])
    return CardModel(int(text))


def shape_request(asks: Sequence[ContainerAsk], cfg: Config, model: int | None) -> SliceRequest | None:
    """Apply the sharing rules to complete asks (memory and cores explicit, as after admission).

    `model` is the pinned card capacity (None = any). Returns None when the pod asks for no slices.
    Raises RequestError for any rule broken; the scheduler never turns a bad ask into "no request".
    """
    cr, mr, kr = cfg.slice_resources
    mine = [a for a in asks if a.asks_slices]
    if not mine:
        return None
    problems: list[str] = []
    for a in mine:
        if a.whole_gpu:
            problems.append(
                f'container "{a.name}": {cfg.whole_card_resource_name} cannot be mixed with {cr}/{mr}/{kr} '
                f"in one container: whole cards are delivered outside the scheduler's accounting; "
                f"ask for either {cfg.whole_card_resource_name} or {cr}")
        if a.count is None:
            problems.append(f'container "{a.name}": {mr}/{kr} need {cr}; add {cr}: 1 for a slice')
    if problems:
        raise RequestError(problems)
    multi = [a for a in mine if (a.count or 0) > 1]
    if multi:
        n = multi[0].count or 0
        for a in mine:
            if a.count != n:
                problems.append(
                    f'container "{a.name}": {cr}={a.count}, but container "{multi[0].name}" asks {cr}={n}; '
                    "a multi-card pod's mthreads containers must all ask the same whole cards")
        if len([a for a in mine if a.beside_apps]) > 1:
            problems.append(f"only one app container may ask {cr}={n} (multi-card): all mthreads containers "
                            "of a pod share the same cards")
        mems = sorted({a.memory for a in mine if a.memory is not None})
        if len(mems) > 1:  # else the first container's value alone would pick the card model
            problems.append(f"containers of a multi-card pod ask different {mr} "
                            f"({', '.join(map(str, mems))}); they share the same whole cards, so the values "
                            "must be equal")
        for a in mine:
            if a.memory is not None and (a.memory % n or (model and a.memory != n * model)):
                want = f"{n * model}" if model else f"{n} x the card's memory"
                problems.append(f'container "{a.name}": {mr}={a.memory} with {cr}={n}: multi-card pods take '
                                f"whole cards, so {mr} must be {want} (or be left out)")
            if a.cores is not None and a.cores != n * CORES_PER_CARD:
                problems.append(f'container "{a.name}": {kr}={a.cores} with {cr}={n}: multi-card pods take '
                                f"whole cards, so {kr} must be {n * CORES_PER_CARD} (or be left out)")
        if problems:
            raise RequestError(problems)
        per_card = mems[0] // n if mems else model  # any container's value (all equal), not just the first
        shares = tuple(ContainerShare(a.name, a.init, per_card or 0, CORES_PER_CARD) if a.asks_slices
                       else ContainerShare(a.name, a.init, 0, 0) for a in asks)
        return SliceRequest(Mode.MULTI, n, per_card or 0, CORES_PER_CARD, 1, per_card, shares)

    # All asks are vgpu 1: one card shared by every mthreads container of the pod.
    exclusive = [a for a in mine if a.memory is None]
    for a in exclusive:
        if a.cores is not None and a.cores != CORES_PER_CARD:
            problems.append(f'container "{a.name}": {kr}={a.cores} without {mr}; a slice needs both: add '
                            f"{mr}, or remove {kr} to take the whole card")
    apps = [a for a in mine if a.beside_apps]  # sidecars run beside the apps
    if exclusive and len(exclusive) != len(mine):
        problems.append(f"exclusive containers (only {cr}: 1: {', '.join(a.name for a in exclusive)}) take "
                        f"the whole card and cannot share it with slice containers "
                        f"({', '.join(a.name for a in mine if a.memory is not None)})")
    elif exclusive and len(apps) > 1:
        problems.append(f"an exclusive container (only {cr}: 1) takes the whole card; "
                        f"no other app container of the pod may share it ({', '.join(a.name for a in apps)})")
    for a in mine:
        if a.cores is not None and not 1 <= a.cores <= CORES_PER_CARD:
            problems.append(f'container "{a.name}": {kr}={a.cores} is outside 1..{CORES_PER_CARD}')
    if problems:
        raise RequestError(problems)
    if exclusive:
        shares = tuple(ContainerShare(a.name, a.init, model or 0, CORES_PER_CARD) if a.asks_slices
                       else ContainerShare(a.name, a.init, 0, 0) for a in asks)
        return SliceRequest(Mode.EXCLUSIVE, 1, model or 0, CORES_PER_CARD, 1, model, shares)
    shares = tuple(
        ContainerShare(a.name, a.init, a.memory or 0, a.cores if a.cores is not None else cfg.default_cores)
        if a.asks_slices else ContainerShare(a.name, a.init, 0, 0)
        for a in asks)
    # what the card holds at once: init containers one at a time, sidecars beside the rest (lifecycle.py)
    fp = footprint((a.kind, s.memory, s.cores, 1 if a.asks_slices else 0) for a, s in zip(asks, shares, strict=True))
    mem, cores, slices = fp.memory, fp.cores, fp.slices
    if cores > CORES_PER_CARD:
        problems.append(f"the pod's slice containers share one card and ask {cores} {kr} in all; "
                        f"a card has {CORES_PER_CARD}")
    if slices > cfg.max_slices_per_card:
        problems.append(f"the pod has {slices} slice containers on one card; a card takes at most "
                        f"{cfg.max_slices_per_card} slices")
    if problems:
        raise RequestError(problems)
    return SliceRequest(Mode.SLICE, 1, mem, cores, slices, model, shares)


def pod_request(pod: Mapping[str, Any], cfg: Config) -> SliceRequest | None:
    """The scheduler's view of an admitted pod: None if it asks for no slices, else its SliceRequest."""
    problems = pod_problems(pod)
    if problems:  # fail closed: a pod we cannot read is never "asks for nothing"
        raise RequestError(problems)
    asks = read_asks(pod, cfg)
    pin = pinned_model(pod, cfg)
    req = shape_request(asks, cfg, pin.memory if pin else None)
    if req is None:
        return None
    if req.mode is Mode.SLICE and pin is not None:
        bad = [s for s in req.shares if not s.empty and not pin.accepts(s.memory)]
        if bad:
            raise RequestError([f'container "{s.name}": {cfg.resource_memory_name}={s.memory} is not valid '
                                f"on the pinned {pin.name}; allowed: {', '.join(map(str, pin.valid_memory))}"
                                for s in bad])
    return req


def held_request(pod: Mapping[str, Any], cfg: Config) -> SliceRequest | None:
    """What a pod already placed holds, read from its resources alone: `pod_request` without its card pin
    (`mtsched.io/card-memory`). The pin chooses where a pod may be placed, never how much it holds there (whole
    cards are booked at their own capacity, slices at their `sgpu-memory`), and the pod's owner may change it any
    time after (no admission judges a pod UPDATE): read for a placed pod, a pin naming no model, or a model its
    slice does not fit, made the request unreadable and closed the pod's node (tests/e2e/test_redteam_card_pin.py).
    """
    problems = pod_problems(pod)
    if problems:  # fail closed, as pod_request
        raise RequestError(problems)
    return shape_request(read_asks(pod, cfg), cfg, None)


def card_accepts(capacity: int, req: SliceRequest) -> bool:
    """Whether a card of `capacity` units can serve the request's model and every slice value."""
    if req.model is not None and req.model != capacity:
        return False
    if req.whole_cards:
        return True
    model = CardModel(capacity)
    return all(s.empty or model.accepts(s.memory) for s in req.shares)
