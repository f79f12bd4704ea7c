"""Red team, clocks: the pod watcher's `_late` (a record seen past half its booking's pending TTL is booked at
once, not held back for our bind's confirmation, because any replica's janitor may expire the booking) estimated
Redis's clock as this host's wall clock plus the offset the janitor last measured (`clock_skew_ms`). A step of
this host's wall clock between two sweeps (an NTP step; sweeps are 5 s apart) moved that estimate by the step: a
step back made an old booking look young, and its record was held back near the TTL, where another replica's
janitor may expire it under the running pod. The estimate is now anchored on the monotonic clock, which steps
do not move."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from controller import pod_watch
from controller.pod_watch import PodWatcher
from shared.config import Config
from shared.domain.annotations import PodUsage
from shared.domain.state import NodeSnapshot, Reservation
from shared.kube import Kube

TTL_S = 120
REDIS_AHEAD_MS = 7_000  # Redis's clock is 7 s ahead of this host's


def watcher(created: int) -> PodWatcher:
    snap = NodeSnapshot("n1", 1, reservations={"u1": Reservation("u1", (0,), 8, 2, 1, "pending", created)})
    mirror = SimpleNamespace(get=lambda node: snap if node == "n1" else None)
    return PodWatcher(Kube(None), None, mirror, Config(pending_ttl_seconds=TTL_S), asyncio.Event())  # type: ignore[arg-type]


@pytest.mark.parametrize("step_s", [-50.0, +50.0])
def test_a_wall_clock_step_between_sweeps_does_not_move_a_bookings_age(monkeypatch: pytest.MonkeyPatch,
                                                                       step_s: float) -> None:
    usage = PodUsage("n1", (0,), 8, 2, 1)
    wall = time.time()
    redis_now = int(wall * 1000) + REDIS_AHEAD_MS
    old = watcher(redis_now - int(TTL_S * 1000 * 0.7))  # 84 s old: past half the TTL
    young = watcher(redis_now - int(TTL_S * 1000 * 0.2))  # 24 s old
    for w in (old, young):
        w.saw_redis_time(redis_now)  # the janitor's sweep: Redis's clock, read now
    assert old._late("u1", usage) and not young._late("u1", usage)
    monkeypatch.setattr(pod_watch.time, "time", lambda: wall + step_s)  # this host's wall clock steps
    assert old._late("u1", usage), "a step of this host's clock made an 84 s old booking look young"
    assert not young._late("u1", usage), "a step of this host's clock made a 24 s old booking look late"
