"""What a pod's containers hold at once, as Kubernetes runs them (pure).

Init containers run one at a time, in order, before the app containers; a sidecar (an init container
with `restartPolicy: Always`) starts in its turn and keeps running beside everything after it. So the
most a pod holds at once is Kubernetes' effective request: max(sum(apps) + sum(sidecars), max over init
containers i of (i + the sidecars started before i)). One rule for the scheduler's booking, the quota
charge and the usage read back from a bound pod's record.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

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
