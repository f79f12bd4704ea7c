"""The parts of API objects a role keeps instead of the objects (pure): what a rule reads, and nothing else a pod
may carry (annotations, env, volumes, status), so what a role holds while it reads many pods is bounded by what
its rules need. The watchers' pod view (controller/pod_watch.py watched_pod) and the webhook's quota view
(shared/domain/quota.py quota_view) are made of these; each has a table proving its rules answer alike."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def picked(obj: object, keys: Sequence[str]) -> dict[str, Any]:
    """`obj`'s entries of `keys` (none when it is not an object)."""
    return {k: obj[k] for k in keys if k in obj} if isinstance(obj, dict) else {}


def part(obj: object, key: str) -> dict[str, Any]:
    """obj[key] when both are objects, else an empty one."""
    got = obj.get(key) if isinstance(obj, dict) else None
    return got if isinstance(got, dict) else {}


def spec_view(spec: object, keys: Sequence[str], container_keys: Sequence[str]) -> dict[str, Any]:
    """`keys` of a pod spec, with its init containers and containers each cut to `container_keys` (anything of
    another type kept as it is: the rules that read it say it is malformed)."""
    out = picked(spec, keys)
    for key in ("initContainers", "containers"):
        got = spec.get(key) if isinstance(spec, dict) else None
        if got is not None:
            out[key] = [picked(c, container_keys) if isinstance(c, dict) else c for c in got] \
                if isinstance(got, list) else got
    return out
