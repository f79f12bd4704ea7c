"""A node whose latest change the node watcher cannot write to the ledger, for a reason no retry cures soon (pure).

Redis refusing that node's write, or a bug on the Node's shape: the other nodes are written, so the role stays ready
for them; this one is closed in the ledger (written as last accepted, with an error: nothing is placed on a state we
know is old), reported (a gauge, a Warning Event on the Node, a log line) and its change tried again with backoff
(controller/node_watch.py `NodeWatcher._stuck`). Only a node that cannot even be closed counts against readiness.
"""

from __future__ import annotations

import hashlib
from typing import Any

STUCK_RETRY_MAX_S = 30.0  # the longest wait between two tries of a closed node's change (a newer state waits it too)
STUCK_REASON = "MtschedNodeNotWritten"  # the Warning Event's reason


def stuck_retry_in(attempt: int, first: float, most: float = STUCK_RETRY_MAX_S) -> float:
    """Seconds before try `attempt` + 1 of a closed node's change (0: the first retry): `first`, doubling, at most
    `most`."""
    return min(most, first * (1 << min(max(attempt, 0), 30)))


def stuck_error(reason: str) -> str:
    """The error a closed node carries in the ledger (what filter, explain and the mirror show)."""
    return f"the watcher cannot write this node's latest state ({reason[:240]}): closed until it can"


def stuck_event(node: str, uid: str, reason: str, component: str, now: str, namespace: str) -> dict[str, Any]:
    """The Warning Event on the Node; named after its uid and the reason, so every watcher replica (and a restarted
    one) reports one problem once (the API server refuses the name again, 409, while the first is kept)."""
    digest = hashlib.sha256(f"{uid}\0{reason}".encode()).hexdigest()[:12]
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{node[:200]}.mtsched-unwritten.{digest}", "namespace": namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid},
        "reason": STUCK_REASON, "type": "Warning",
        "message": f"node offers no sliced card: {stuck_error(reason)}; tried again with backoff"[:1024],
        "source": {"component": component}, "reportingComponent": component,
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    }
