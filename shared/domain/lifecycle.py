"""What a pod's containers hold at once, as Kubernetes runs them (pure).

Init containers run one at a time, in order, before the app containers; a sidecar (an init container
with `restartPolicy: Always`) starts in its turn and keeps running beside everything after it. So the
most a pod holds at once is Kubernetes' effective request: max(sum(apps) + sum(sidecars), max over init
containers i of (i + the sidecars started before i)). One rule for the scheduler's booking, the quota
charge and the usage read back from a bound pod's record.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

INIT, SIDECAR, APP = "init", "sidecar", "app"


def kind_of(container: Mapping[str, object], init: bool) -> str:
    """INIT, SIDECAR or APP for a container of spec.initContainers (`init`) or spec.containers."""
    if not init:
        return APP
    return SIDECAR if container.get("restartPolicy") == "Always" else INIT


def peak(parts: Iterable[tuple[str, int]]) -> int:
    """The most held at once of (kind, amount) per container, init containers in their order."""
    sidecars = top = apps = 0
    for kind, amount in parts:
        if kind == SIDECAR:
            sidecars += amount
            top = max(top, sidecars)
        elif kind == INIT:
            top = max(top, sidecars + amount)
        else:
            apps += amount
    return max(top, sidecars + apps)


@dataclass(frozen=True)
class Footprint:
    """What a pod's containers hold together on one card: memory units, core groups, slice instances."""

    memory: int
    cores: int
    slices: int


def footprint(held: Iterable[tuple[str, int, int, int]]) -> Footprint:
    """The pod's footprint on one card from (kind, memory, cores, slices) per container, init containers
    in their order: the peak of each, as Kubernetes runs them. The request parser (what a pod books) and
    the allocation-record decoder (what a bound pod's record books) both use this, so they cannot drift."""
    parts = list(held)
    return Footprint(peak((k, m) for k, m, _, _ in parts), peak((k, c) for k, _, c, _ in parts),
                     peak((k, n) for k, _, _, n in parts))
