"""mtsched_pods_untried_oldest_seconds: how long the oldest pod of our scheduler has waited with no attempt by
any scheduler (no PodScheduled condition), the watchers' signal that no kube-scheduler of our profile works
(MtschedPodsUntried). Real PodWatcher fed watch events; the clock is time.monotonic, patched to step."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from controller import pod_watch
from controller.pod_watch import PodWatcher, tried
from shared.config import Config
from tests.unit.test_nudger import _NoOwner, _pod


def _attempted(uid: str, reason: str = "Unschedulable") -> dict[str, Any]:
    pod = _pod(uid)
    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": reason}]
    return pod


@pytest.mark.parametrize(("conditions", "expected"), [
    (None, False), ([], False), ([{"type": "Ready", "status": "False"}], False), (["junk"], False),
    ([{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}], True),
    ([{"type": "PodScheduled", "status": "False", "reason": "SchedulerError"}], True),
    # set on a gated pod, which no scheduler tries, and left after its gates go until one does (red team)
    ([{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}], False),
])
def test_a_pod_counts_as_tried_by_its_pod_scheduled_condition(conditions: Any, expected: bool) -> None:
    pod = _pod("p")
    if conditions is not None:
        pod["status"]["conditions"] = conditions
    assert tried(pod) is expected


async def test_the_oldest_untried_pod_is_measured_until_it_is_tried_bound_or_gone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(pod_watch.time, "monotonic", lambda: now[0])
    w = PodWatcher(None, None, _NoOwner(), Config(), asyncio.Event())  # type: ignore[arg-type]
    w.reflector.synced.set()
    assert w.untried_for() == 0.0
    await w.on_event("ADDED", _pod("other", scheduler="default-scheduler"))
    await w.on_event("ADDED", _pod("bound", node="n1"))
    assert w.untried_for() == 0.0  # not ours, or placed
    await w.on_event("ADDED", _pod("p1"))
    now[0] += 30
    await w.on_event("ADDED", _pod("p2"))
    await w.on_event("MODIFIED", _pod("p1"))  # an update that is no attempt keeps its first sight
    now[0] += 30
    assert w.untried_for() == 60.0  # p1, the oldest
    await w.on_event("MODIFIED", _attempted("p1"))  # kube-scheduler tried it (it waits, but not untried)
    assert w.untried_for() == 30.0  # p2 now
    await w.on_sync([_attempted("p1"), _pod("p2"), _pod("p3")])  # a re-list keeps p2's first sight
    now[0] += 10
    assert w.untried_for() == 40.0
    await w.on_event("MODIFIED", _pod("p2", node="n1"))  # bound
    await w.on_event("DELETED", _pod("p3"))
    assert w.untried_for() == 0.0 and not w.untried
    gated = _pod("g")
    gated["spec"]["schedulingGates"] = [{"name": "queue"}]
    gated["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]
    await w.on_event("ADDED", gated)  # held by its gates, not by a missing scheduler
    now[0] += 600
    assert w.untried_for() == 0.0
    del gated["spec"]["schedulingGates"]  # released: untried from now, its condition still SchedulingGated
    await w.on_event("MODIFIED", gated)
    now[0] += 400
    assert w.untried_for() == 400.0
    w.reflector._failing(OSError("connection reset"))  # the pod view is down: an attempt may have been missed
    assert w.untried_for() == 0.0
    w.reflector._working()
    assert w.untried_for() == 400.0
