"""When the extender beside the leader kube-scheduler hands the leadership over (controller/leadership.py).

In the chart the extender is a sidecar of kube-scheduler, called on the pod's loopback, and only the replica that
holds kube-scheduler's Lease schedules. An extender that cannot do its job there (cut off from Redis, its mirror
stuck) fails every GPU pod's filter and bind while a ready replica stands by, for as long as the fault lasts: no
readiness probe moves a Lease. So the extender of the leader pod, unready for `after` seconds while another
replica's pod is Ready, writes the Lease over with a holder no kube-scheduler has (`yielded_holder`): its own
kube-scheduler can no longer renew, gives up at its renew deadline (and exits, as kube-scheduler does when it
loses the Lease), and a ready replica acquires it once the written record has lasted its `leaseDurationSeconds`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class YieldView:
    """What one check sees. Times are time.monotonic() seconds."""
    now: float
    unready_since: float | None  # when this extender was first seen unready, without a ready check since
    holder: str  # the Lease's holderIdentity ("" when none, or when the Lease could not be read)
    pod: str  # this pod's name
    peers_ready: int  # the other pods of the scheduler Deployment that are Ready and not being deleted
    last_yield: float | None  # when this process last wrote the Lease over


def holds(holder: str, pod: str) -> bool:
    """Whether the kube-scheduler of pod `pod` holds the Lease: it names itself `<hostname>_<uuid>`
    (kube-scheduler's options.go), and a pod's hostname is its name (the chart sets no `hostname`)."""
    return bool(pod) and holder.startswith(pod + "_")


def yielded_holder(pod: str) -> str:
    """The holder written over the Lease: no kube-scheduler's identity (none has a "/"), names who wrote it."""
    return f"{pod}/yielded"


def yield_reason(v: YieldView, after: float) -> str:
    """Why this extender hands the leadership over now, or "" when it does not (`after` <= 0: never)."""
    if after <= 0 or v.unready_since is None or v.now - v.unready_since < after:
        return ""
    if not holds(v.holder, v.pod) or v.peers_ready < 1:
        return ""  # not the leader's extender, or no replica that could do better
    if v.last_yield is not None and v.now - v.last_yield < after:
        return ""  # its kube-scheduler won the Lease back first: once more after `after`, not in a loop
    return (f"unready for {v.now - v.unready_since:.0f}s (at least {after:.0f}s) beside the leader kube-scheduler "
            f"while {v.peers_ready} other replica(s) are Ready")


def ready_peers(pods: Mapping[str, Any], me: str) -> int:
    """The pods of a list other than `me` that are Ready and not being deleted."""
    count = 0
    for p in pods.get("items") or ():
        meta = p.get("metadata") or {}
        if meta.get("name") == me or meta.get("deletionTimestamp"):
            continue
        conditions = (p.get("status") or {}).get("conditions") or ()
        if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
            count += 1
    return count


def lapsed(spec: Mapping[str, Any], now: float) -> bool:
    """Whether the Lease's last renewal is older than its duration at `now` (on the renewer's clock: the wall
    clock of the host of the kube-scheduler that stamped renewTime, client-go's `Now()`, not the API server's):
    every candidate may take it; written over, it would wait a duration more. Unreadable: not lapsed."""
    try:
        renewed = datetime.fromisoformat(str(spec.get("renewTime"))).timestamp()
        return renewed + int(spec.get("leaseDurationSeconds") or 15) < now
    except (TypeError, ValueError):
        return False
