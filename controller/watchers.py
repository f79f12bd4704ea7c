"""Watchers: stream nodes and pods into the ledger and release shares when pods end; this module wires the parts.

The watcher role's parts: the node watcher (controller/node_watch.py), the pod watcher (controller/pod_watch.py),
the nudge that tells kube-scheduler a node has room again (controller/nudger.py) and the janitor of bookings no
Binding followed (controller/janitor.py); the reconciler (controller/reconciler.py) compares all of it with the API.

Several watcher replicas may run at once: every write is idempotent (upsert by node, observe and
release by pod uid, expiry by age), so duplicates converge to the same state. We chose this over
a Lease because a standby would be cold when the leader dies, and releases would stall for the
lease duration; the cost is duplicate Redis calls, which are cheap. The one transient effect: a
lagging replica may re-record a pod the other already released, until its own DELETED event
arrives a moment later.
"""

from __future__ import annotations

from controller.janitor import Janitor
from controller.node_watch import NodeWatcher
from controller.pod_watch import PodWatcher
from shared.config import Config
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror


def wire(nodes: NodeWatcher, pods: PodWatcher) -> None:
    """Connect one role's two watchers: each reads the other's view of the API."""
    nodes.holders = pods.holders
    nodes.ended = lambda: pods.ended
    nodes.quarantine = pods.quarantine
    nodes.nudge = pods.nudger.nudge
    pods.nudger.known_nodes = lambda: nodes.last  # the Nodes to patch when every one asked is gone
    nodes.view_problem = lambda: pods.reflector.problem(0)
    pods.inventories = lambda: nodes.last


# How long the pod stream must have worked, after its list or a resume, before the janitor expires anything:
# a resumed watch replays the events it missed, a bound pod's record among them
JANITOR_VIEW_SETTLE_SECONDS = 10.0


def janitor_for(ledger: Ledger, mirror: Mirror, cfg: Config, pods: PodWatcher) -> Janitor:
    """The watcher role's janitor, wired to its pod watcher: the records it holds back are booked, never
    expired (before_expire), none is expired while its pod view is blind (view_problem) nor while the API server
    holds its pod bound there (api_holds: a live view may be behind), and it learns Redis's clock from each sweep
    (redis_time), for `_late`."""
    def view_problem() -> str:
        return pods.reflector.unsettled(JANITOR_VIEW_SETTLE_SECONDS)

    janitor = Janitor(ledger, mirror, cfg, nudger=pods.nudger, before_expire=pods.confirm_now,
                      redis_time=pods.saw_redis_time, view_problem=view_problem, api_holds=pods.api_holds)
    # its reads waiting for their turn are not made once it is blind: the janitor's own check, asked at each turn
    # (one judgement of the view, whatever the janitor is given)
    pods.reads_blind = lambda: janitor.view_problem()
    return janitor
