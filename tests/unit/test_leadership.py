"""When the leader pod's extender hands kube-scheduler's Lease over (shared/domain/leadership.py), by table, and one
look of the task (controller/leadership.py) against a stand-in API: what it reads, what it writes, and that no
failure of the API escapes it (a failing task would itself make the role unready). The real API server and a real
kube-scheduler: tests/e2e/test_leader_yield.py."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from controller.leadership import LeaderYield, micro_time
from shared.domain.leadership import YieldView, holds, lapsed, ready_peers, yield_reason, yielded_holder
from shared.kube import KubeError, ServerClock
from tests.unit._servers import CFG

POD = "hami-scheduler-7d9-abcde"
MINE = f"{POD}_0b1c2d3e-aaaa-bbbb-cccc-0123456789ab"


@pytest.mark.parametrize(("view", "yields"), [
    (YieldView(100, None, MINE, POD, 1, None), False),  # ready
    (YieldView(100, 41, MINE, POD, 1, None), False),  # unready 59 s
    (YieldView(100, 40, MINE, POD, 1, None), True),  # unready 60 s, the leader's, a Ready replica
    (YieldView(100, 40, MINE, POD, 0, None), False),  # no Ready replica: nobody would do better
    (YieldView(100, 40, "hami-scheduler-7d9-fghij_0b1c", POD, 1, None), False),  # another pod leads
    (YieldView(100, 40, f"{POD}x_0b1c", POD, 1, None), False),  # a pod whose name only begins like ours
    (YieldView(100, 40, "", POD, 1, None), False),  # nobody holds it
    (YieldView(100, 40, yielded_holder(POD), POD, 1, None), False),  # already written over
    (YieldView(100, 40, MINE, "", 1, None), False),  # no pod name
    (YieldView(100, 0, MINE, POD, 1, 41), False),  # won back 59 s after the last hand-over
    (YieldView(100, 0, MINE, POD, 1, 40), True),  # ... 60 s after
])
def test_when_it_hands_over(view: YieldView, yields: bool) -> None:
    assert bool(yield_reason(view, 60)) is yields
    assert yield_reason(view, 0) == ""  # 0: never


def test_the_written_holder_is_no_kube_scheduler_and_not_ours() -> None:
    assert holds(MINE, POD) and not holds(yielded_holder(POD), POD)
    assert "_" not in yielded_holder(POD)


def test_ready_peers_counts_other_ready_pods_not_being_deleted() -> None:
    def pod(name: str, ready: str, deleting: bool = False) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name, **({"deletionTimestamp": "2026-12-05T00:00:00Z"} if deleting else {})}
        return {"metadata": meta, "status": {"conditions": [{"type": "Ready", "status": ready}]}}
    pods = {"items": [pod(POD, "True"), pod("a", "True"), pod("b", "False"), pod("c", "True", deleting=True),
                      {"metadata": {"name": "d"}}]}
    assert ready_peers(pods, POD) == 1


class StandIn:
    """The API calls of one look, answered from a script; records what was sent."""

    def __init__(self, lease: dict[str, Any], pods: dict[str, Any], put_status: int = 200,
                 fail: Exception | None = None) -> None:
        self.lease, self.pods, self.put_status, self.fail = lease, pods, put_status, fail
        self.calls: list[tuple[str, str, Any]] = []
        self.events: list[tuple[str, str]] = []
        self.server_clock = ServerClock()  # (no dated answer: the host's clock)

    async def request(self, method: str, path: str, body: Any = None, query: Any = None, **_: Any) -> Any:
        self.calls.append((method, path, body))
        if self.fail is not None:
            raise self.fail
        if method == "GET" and path.endswith("/pods"):
            assert query == {"labelSelector": "app=sched"}
            return self.pods
        if method == "GET":
            return self.lease
        if self.put_status != 200:
            raise KubeError(self.put_status, {"message": "the object has been modified"}, f"{method} {path}")
        return body

    async def create_event(self, pod: Any, reason: str, message: str, kind: str, component: str) -> None:
        self.events.append((reason, message))


def lease(holder: str) -> dict[str, Any]:
    return {"metadata": {"name": "hami-scheduler", "namespace": "kube-system", "resourceVersion": "7"},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "leaseTransitions": 2}}


READY = {"items": [{"metadata": {"name": "other"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}]}
CFG_ON = dataclasses.replace(CFG, leader_yield_seconds=30, leader_lease="kube-system/hami-scheduler",
                             leader_peers="app=sched", pod_name=POD)


async def look(kube: StandIn, unready_for: float) -> tuple[str, LeaderYield]:
    now = [0.0]
    y = LeaderYield(CFG_ON, kube, lambda: ["redis: not reachable"], clock=lambda: now[0])  # type: ignore[arg-type]
    assert await y.check() == ""
    now[0] = unready_for
    return await y.check(), y


async def test_a_look_writes_the_lease_over_with_the_version_it_read() -> None:
    kube = StandIn(lease(MINE), READY)
    reason, y = await look(kube, 30)
    assert reason and y.yields == 1
    put = [c for c in kube.calls if c[0] == "PUT"]
    assert len(put) == 1 and put[0][1] == "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/hami-scheduler"
    spec = put[0][2]["spec"]
    assert spec["holderIdentity"] == yielded_holder(POD) and spec["leaseTransitions"] == 3
    assert spec["leaseDurationSeconds"] == 15 and spec["renewTime"] == spec["acquireTime"]
    assert put[0][2]["metadata"]["resourceVersion"] == "7"  # a renewal in between: 409, not overwritten
    assert [r for r, _ in kube.events] == ["LeadershipYielded"] and "redis: not reachable" in kube.events[0][1]


async def test_no_api_call_before_the_time_and_none_escapes_after() -> None:
    kube = StandIn(lease(MINE), READY)
    reason, _ = await look(kube, 29)
    assert reason == "" and kube.calls == []
    for failing in (StandIn(lease(MINE), READY, put_status=409),
                    StandIn(lease(MINE), READY, fail=KubeError(403, {"message": "forbidden"}, "GET")),
                    StandIn(lease(MINE), READY, fail=OSError("connection refused"))):
        reason, y = await look(failing, 31)
        assert reason == "" and y.yields == 0 and failing.events == []


async def test_ready_again_starts_the_count_again() -> None:
    now = [0.0]
    problems = ["mirror: not in sync with Redis"]
    kube = StandIn(lease(MINE), READY)
    y = LeaderYield(CFG_ON, kube, lambda: problems, clock=lambda: now[0])  # type: ignore[arg-type]
    await y.check()
    now[0] = 20
    problems.clear()
    await y.check()  # ready at 20 s
    problems.append("mirror: not in sync with Redis")
    now[0] = 21
    await y.check()
    now[0] = 50
    assert await y.check() == ""  # 29 s since it was unready again
    now[0] = 51
    assert await y.check()


def test_off_unless_configured_and_the_time_format() -> None:
    assert not LeaderYield.wanted(CFG)
    assert not LeaderYield.wanted(dataclasses.replace(CFG_ON, pod_name=""))
    assert not LeaderYield.wanted(dataclasses.replace(CFG_ON, leader_lease=""))
    assert LeaderYield.wanted(CFG_ON)
    assert micro_time(0) == "1970-01-01T00:00:00.000000Z"


async def test_a_lapsed_lease_is_left_as_it_is() -> None:
    """Its kube-scheduler is gone already (no renewal for longer than the duration): every candidate may take it
    now, and written over it would wait a duration more (red team)."""
    old = lease(MINE)
    old["spec"]["renewTime"] = "2020-01-01T00:00:00.000000Z"
    kube = StandIn(old, READY)
    reason, _ = await look(kube, 30)
    assert reason == "" and not [c for c in kube.calls if c[0] == "PUT"]
    assert lapsed({"renewTime": "2026-12-05T15:20:00.000000Z", "leaseDurationSeconds": 15}, 1796484016.0)
    assert not lapsed({"renewTime": "2026-12-05T15:20:00.000000Z", "leaseDurationSeconds": 15}, 1796484014.0)
    assert not lapsed({"renewTime": "garbled"}, 1796484016.0) and not lapsed({}, 1796484016.0)


async def test_the_lease_is_written_on_the_api_servers_clock() -> None:
    kube = StandIn(lease(MINE), READY)
    kube.server_clock.note("Sat, 05 Dec 2026 15:20:00 GMT")
    await look(kube, 30)
    spec = next(c for c in kube.calls if c[0] == "PUT")[2]["spec"]
    assert spec["renewTime"].startswith("2026-12-05T15:20:0"), spec
