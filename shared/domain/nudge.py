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

That pre-check is kube-scheduler's resource fit without the extender's `ignoredByScheduler`: it counts
mthreads.com/vgpu, which no Node offers, so no Node event at all requeues a pod asking for it where the pre-check
runs: kube-scheduler before 1.32 (it skips the pre-check with queueing hints on only from 1.32, where they are on by
default), and 1.32-1.33 with the hints switched off. There such a pod is tried again at a pod's deletion anywhere
in the cluster, or at kube-scheduler's sweep of the pods it parked (every 30 s, those parked longer than
`--pod-max-in-unschedulable-pods-duration`, 5 minutes by default): for a kube-scheduler older than 1.32 the chart
shortens that to UNSCHEDULABLE_RETRY (`hami.kubeSchedulerArgs`, the twin of `unschedulable_retry_args`).
"""

from __future__ import annotations

import re

ANY_NODE_FROM_MINOR = 34  # kube-scheduler 1.34: SchedulerQueueingHints GA and locked on
NODE_EVENTS_FROM_MINOR = 32  # kube-scheduler 1.32: no pre-check of Node events with queueing hints (on by default)
# kube-scheduler's --pod-max-in-unschedulable-pods-duration below NODE_EVENTS_FROM_MINOR: every pod parked longer is
# tried again at its next sweep (every 30 s), so a pod turned away is tried again within about 40 s
UNSCHEDULABLE_RETRY = "10s"


def minor_of(version: str) -> int | None:
    """The minor of a Kubernetes 1.x `version` (an image tag or `--version`'s: "v1.34.1", "1.36.0",
    "v1.35.2-gke.1", "Kubernetes v1.36.3"); None if unreadable."""
    m = re.search(r"(?:^|\s)v?(\d+)\.(\d+)\.\d+", version.strip())
    return int(m.group(2)) if m is not None and m.group(1) == "1" else None


def any_node_wakes(version: str) -> bool:
    """Whether a kube-scheduler of `version` requeues every pod an extender turned away on any Node's update.
    Anything unreadable is no: a per-Node nudge wakes whatever a cluster-wide one would, with every kube-scheduler."""
    minor = minor_of(version)
    return minor is not None and minor >= ANY_NODE_FROM_MINOR


def unschedulable_retry_args(version: str) -> tuple[str, ...]:
    """kube-scheduler's arguments for `version` where no Node nudge wakes a pod asking for mthreads.com/vgpu (before
    1.32: the module's docstring): its retry of parked pods shortened to UNSCHEDULABLE_RETRY. None for 1.32 and
    newer, nor for anything unreadable."""
    minor = minor_of(version)
    if minor is None or minor >= NODE_EVENTS_FROM_MINOR:
        return ()
    return (f"--pod-max-in-unschedulable-pods-duration={UNSCHEDULABLE_RETRY}",)


def next_first(earliest: float, last_first: float | None, interval: float) -> float:
    """When the next first patch goes when coalesced: `interval` after the earliest ask it has not served (a
    release the extenders' mirrors may not have applied before then), and `interval` after the last first patch
    (at most one an interval, whatever the number of Nodes that gained room)."""
    return max(earliest + interval, (last_first if last_first is not None else earliest) + interval)


def served(latest: float, sent_at: float, interval: float) -> bool:
    """Whether a first patch sent at `sent_at` served every ask up to the latest, at `latest`: an ask needs a patch
    `interval` after it, so one less than `interval` before the patch needs the next one."""
    return latest <= sent_at - interval
