"""When the watchers' Node nudge may touch any one Node rather than each Node that gained room (pure).

kube-scheduler tries a pod our extender turned away again only on a cluster event. A pod rejected by an extender
carries the pseudo-plugin `Extender` among its rejectors, which kube-scheduler registers for every event, so with
queueing hints (GA and always on from kube-scheduler 1.34) any Node update requeues every such pod, whichever Node
it touched. Without them (1.33 and older, where they can be off) a Node update requeues only the pods that pass a
pre-check against that Node (its affinity, taints and resources), so there the nudge must touch the Node that gained
room. kube-scheduler may be one minor release older than the API server, so the API server's version decides:
1.35 or newer means a kube-scheduler of 1.34 or newer (controller/nudger.py, `cluster_wide`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

ANY_NODE_FROM_MINOR = 35  # the API server's minor version from which one Node's update wakes every turned-away pod


def any_node_wakes(version: Mapping[str, Any] | Any) -> bool:
    """Whether `version` (the API server's `/version` answer) guarantees a kube-scheduler whose queueing hints are
    always on. Anything unreadable is no: per-Node nudges work either way."""
    if not isinstance(version, Mapping):
        return False
    major, minor = str(version.get("major", "")), str(version.get("minor", ""))
    m = re.fullmatch(r"(\d+)\+?", minor)  # "35", or "35+" from some providers
    if major == "1" and m:
        return int(m.group(1)) >= ANY_NODE_FROM_MINOR
    g = re.match(r"v(\d+)\.(\d+)\.", str(version.get("gitVersion", "")))
    return g is not None and g.group(1) == "1" and int(g.group(2)) >= ANY_NODE_FROM_MINOR


def next_first(earliest: float, last_first: float | None, interval: float) -> float:
    """When the next first patch goes in cluster-wide mode: `interval` after the earliest ask it has not served (a
    release the extenders' mirrors may not have applied before then), and `interval` after the last first patch
    (at most one a interval, whatever the number of Nodes that gained room)."""
    return max(earliest + interval, (last_first if last_first is not None else earliest) + interval)


def served(latest: float, sent_at: float, interval: float) -> bool:
    """Whether a first patch sent at `sent_at` served every ask up to the latest, at `latest`: an ask needs a patch
    `interval` after it, so one less than `interval` before the patch needs the next one."""
    return latest <= sent_at - interval
