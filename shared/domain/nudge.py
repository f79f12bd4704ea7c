"""When the watchers' Node nudge may touch any one Node rather than each Node that gained room (pure).

kube-scheduler tries a pod our extender turned away again only on a cluster event. A pod an extender rejected
carries the pseudo-plugin `Extender` among its rejectors, which kube-scheduler registers for every event, so with
queueing hints (GA and always on from kube-scheduler 1.34; Beta before, off by default up to 1.31 and switchable
off in 1.32-1.33) any Node update requeues every such pod, whichever Node it touched. Without them a Node update
requeues only the pods that pass a pre-check against that Node (its affinity, taints and resources), so there the
nudge must touch the Node that gained room. It is the version of the kube-scheduler that calls the extender that
counts (the chart's own Deployment, whose image tag the chart knows: `hami.nudgeAnyNode` in
deploy/helm/hami/templates/_helpers.tpl is this rule's twin, tests/deploy/test_chart.py proves they agree), not the
API server's: a chart pinned to an older kube-scheduler image meets a newer API server.
"""

from __future__ import annotations

import re

ANY_NODE_FROM_MINOR = 34  # kube-scheduler 1.34: SchedulerQueueingHints GA and locked on


def any_node_wakes(version: str) -> bool:
    """Whether a kube-scheduler of `version` (an image tag or `--version`'s: "v1.34.1", "1.36.0", "v1.35.2-gke.1",
    "Kubernetes v1.36.3") requeues every pod an extender turned away on any Node's update. Anything unreadable is
    no: per-Node nudges work with every kube-scheduler."""
    m = re.search(r"(?:^|\s)v?(\d+)\.(\d+)\.\d+", version.strip())
    return m is not None and m.group(1) == "1" and int(m.group(2)) >= ANY_NODE_FROM_MINOR


def next_first(earliest: float, last_first: float | None, interval: float) -> float:
    """When the next first patch goes when coalesced: `interval` after the earliest ask it has not served (a
    release the extenders' mirrors may not have applied before then), and `interval` after the last first patch
    (at most one an interval, whatever the number of Nodes that gained room)."""
    return max(earliest + interval, (last_first if last_first is not None else earliest) + interval)


def served(latest: float, sent_at: float, interval: float) -> bool:
    """Whether a first patch sent at `sent_at` served every ask up to the latest, at `latest`: an ask needs a patch
    `interval` after it, so one less than `interval` before the patch needs the next one."""
    return latest <= sent_at - interval
