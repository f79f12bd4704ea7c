"""The Nudger's cluster-wide mode (controller/nudger.py `cluster_wide`, the rule shared/domain/nudge.py): where one
Node's update wakes every pod the extender turned away, the nudges of all Nodes are one first patch per interval and
one follow-up after the last; every ask still gets a patch at least `interval` after it. The API client records the
patches; waits are on the nudger's own tasks, never fixed sleeps."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any
from unittest import mock

import pytest

from controller.nudger import Nudger
from shared.domain.nudge import any_node_wakes, next_first, served, unschedulable_retry_args
from shared.kube import KubeError
from tests.unit.test_nudger import Patches, settled


@pytest.mark.parametrize(("version", "wakes"), [
    ("v1.36.3", True),
    ("Kubernetes v1.36.3", True),  # kube-scheduler --version
    ("1.34.0", True),  # a tag without its v
    ("v1.34.1-gke.1200", True),
    ("v1.33.5", False),  # queueing hints can be off (a feature gate)
    ("v1.30.4", False),  # off by default
    ("v2.0.0", False),  # unknown: Node by Node works with every kube-scheduler
    ("latest", False),
    ("v1.36", False),
    ("sha256:0123abcd", False),
    ("", False),
])
def test_which_kube_scheduler_wakes_every_turned_away_pod_on_any_node(version: str, wakes: bool) -> None:
    assert any_node_wakes(version) is wakes


@pytest.mark.parametrize(("version", "args"), [
    ("Kubernetes v1.30.14", ("--pod-max-in-unschedulable-pods-duration=10s",)),  # the Node pre-check counts vgpu
    ("1.31.2", ("--pod-max-in-unschedulable-pods-duration=10s",)),
    ("v1.32.0", ()),  # no pre-check with queueing hints, on by default
    ("v1.36.3", ()),
    ("latest", ()),  # unknown: a current kube-scheduler
    ("v2.0.0", ()),
])
def test_which_kube_scheduler_retries_parked_pods_sooner(version: str, args: tuple[str, ...]) -> None:
    assert unschedulable_retry_args(version) == args


@pytest.mark.parametrize(("earliest", "last_first", "interval", "due"), [
    (10.0, None, 0.5, 10.5),  # the first ask: interval after it
    (10.0, 9.8, 0.5, 10.5),
    (10.0, 10.2, 0.5, 10.7),  # a patch went 0.2 s ago: no second one within the interval
    (12.0, 10.0, 0.5, 12.5),
])
def test_next_first(earliest: float, last_first: float | None, interval: float, due: float) -> None:
    assert next_first(earliest, last_first, interval) == pytest.approx(due)


@pytest.mark.parametrize(("latest", "sent_at", "done"), [(10.0, 10.5, True), (10.0, 10.6, True), (10.1, 10.5, False)])
def test_served(latest: float, sent_at: float, done: bool) -> None:
    assert served(latest, sent_at, 0.5) is done


def one_instant() -> Any:
    """Asks made in one instant (the loop's clock held while they are made): on a loaded machine a loop of asks can
    span more than the first patch's oversleep, and an ask less than `interval` before that patch rightly gets
    another one (served), which a test of asks made together does not mean to count."""
    loop = asyncio.get_running_loop()
    return mock.patch.object(loop, "time", return_value=loop.time())


def cluster_wide(kube: Any, interval: float = 0.02, follow_up: float = 0.05) -> Nudger:
    n = Nudger(kube, interval=interval, follow_up=follow_up)
    n.cluster_wide = True
    return n


async def test_releases_on_a_hundred_nodes_are_one_patch_and_one_follow_up() -> None:
    kube = Patches()
    n = cluster_wide(kube)
    with one_instant():
        for i in range(100):
            n.nudge(f"n{i:03}")
    await settled(n)
    assert kube.sent == ["n099", "n099"], kube.sent  # the Node asked last, then its follow-up
    assert n.outcomes == {("first", "sent"): 1, ("follow_up", "sent"): 1}


async def test_every_ask_gets_a_patch_an_interval_after_it_and_patches_are_an_interval_apart() -> None:
    loop = asyncio.get_running_loop()
    times: list[float] = []

    class Timed(Patches):
        async def request(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
            times.append(loop.time())
            return await super().request(method, path, body, **kw)

    kube = Timed()
    interval = 0.05
    n = cluster_wide(kube, interval=interval, follow_up=0.2)
    asks: list[float] = []
    for i in range(12):  # asks every 0.02 s for a quarter second: more than one per interval
        asks.append(loop.time())
        n.nudge(f"n{i}")
        await asyncio.sleep(0.02)
    await settled(n)
    firsts, follow_ups = n.outcomes[("first", "sent")], n.outcomes.get(("follow_up", "sent"), 0)
    assert follow_ups == 1 and firsts == len(times) - 1
    first_times = times[:-1]
    assert firsts < len(asks)  # coalesced
    slack = 0.005  # the loop's clock resolution
    assert all(b - a >= interval - slack for a, b in itertools.pairwise(first_times)), first_times
    for t in asks:  # each ask was served by a first patch at least an interval after it
        assert any(s >= t + interval - slack for s in first_times), (t, first_times)
    assert times[-1] - first_times[-1] >= 0.2 - slack  # the follow-up after the last first patch
    assert kube.sent[-1] == kube.sent[-2] == "n11"


async def test_an_ask_during_the_follow_up_wait_gets_its_first_patch_and_a_later_follow_up() -> None:
    kube = Patches()
    n = cluster_wide(kube, interval=0.01, follow_up=0.1)
    n.nudge("a")
    await kube.went.wait()  # a's first patch
    kube.went.clear()
    n.nudge("b")
    await settled(n)
    assert kube.sent == ["a", "b", "b"], kube.sent  # a's follow-up gave way to b's pair


async def test_a_node_gone_is_skipped_for_the_one_asked_before_it() -> None:
    class Gone(Patches):
        async def request(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
            if path.endswith("/last"):
                raise KubeError(404, "not found", path)
            return await super().request(method, path, body, **kw)

    kube = Gone()
    n = cluster_wide(kube)
    with one_instant():
        for node in ("first", "second", "last"):
            n.nudge(node)
    await settled(n)
    assert kube.sent == ["second", "second"]
    assert n.outcomes == {("first", "gone"): 1, ("first", "sent"): 1, ("follow_up", "sent"): 1}


async def test_with_no_pod_waiting_nothing_is_sent() -> None:
    kube = Patches()
    n = Nudger(kube, interval=0.01, follow_up=0.02, someone_waits=lambda: False)  # type: ignore[arg-type]
    n.cluster_wide = True
    with one_instant():
        for node in ("a", "b"):
            n.nudge(node)
    await settled(n)
    assert kube.sent == [] and n.outcomes == {("first", "idle"): 1, ("follow_up", "idle"): 1}


async def test_a_refused_patch_is_counted_and_the_follow_up_still_goes() -> None:
    kube = Patches(fail=1, status=403)
    n = cluster_wide(kube)
    n.nudge("a")
    await settled(n)
    assert kube.sent == ["a"] and n.outcomes == {("first", "error"): 1, ("follow_up", "sent"): 1}


async def test_a_nudge_for_no_node_in_particular_patches_a_node_that_exists() -> None:
    kube = Patches()
    n = cluster_wide(kube)
    n.known_nodes = lambda: ["k1", "k2"]  # the node watcher's view (controller/watchers.py wire)
    n.nudge_any()
    await settled(n)
    assert kube.sent == ["k1", "k1"], kube.sent  # one first patch and its follow-up
