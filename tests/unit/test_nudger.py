"""The Nudger's node patches: one soon after a release, a follow-up seconds later, coalesced per node.

The follow-up is what makes a freed card reach a parked pod in bounded time when kube-scheduler's retry
after the first patch met an extender whose mirror had not yet applied the release (or a retry already in
flight): without it the pod waits for kube-scheduler's 5-minute flush. The API client records the patches;
nothing else is faked. Waits are on conditions (the nudger's own tasks), never on fixed sleeps."""

from __future__ import annotations

import asyncio
from typing import Any

from controller.watchers import FREED_ANNOTATION, Nudger
from shared.kube import KubeError
from shared.serving.metrics import NUDGES


class Patches:
    def __init__(self, fail: int = 0, status: int = 403) -> None:
        self.sent: list[str] = []
        self.fail, self.status = fail, status  # the first `fail` patches are refused with `status`
        self.went = asyncio.Event()  # a patch was sent

    async def request(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        assert method == "PATCH" and path.startswith("/api/v1/nodes/"), (method, path)
        assert kw.get("content_type") == "application/merge-patch+json"
        assert set(body["metadata"]["annotations"]) == {FREED_ANNOTATION}
        if self.fail:
            self.fail -= 1
            raise KubeError(self.status, "refused", path)
        self.sent.append(path.rsplit("/", 1)[1])
        self.went.set()
        return {}


async def settled(n: Nudger) -> None:
    while n._tasks:
        await asyncio.gather(*list(n._tasks))


def count(which: str, result: str) -> float:
    """The process-wide metric (other tests' nudgers may add to it meanwhile: the loop is shared)."""
    return NUDGES.labels(which, result)._value.get()  # type: ignore[attr-defined, no-any-return]


async def test_a_release_sends_a_patch_and_a_follow_up() -> None:
    kube = Patches()
    n = Nudger(kube, interval=0.01, follow_up=0.02)  # type: ignore[arg-type]
    first, later = count("first", "sent"), count("follow_up", "sent")
    n.nudge("a")
    await settled(n)
    assert kube.sent == ["a", "a"] and n.sent == 2
    assert n.outcomes == {("first", "sent"): 1, ("follow_up", "sent"): 1}
    assert count("first", "sent") - first >= 1 and count("follow_up", "sent") - later >= 1  # and the metric


async def test_a_burst_on_one_node_is_coalesced_and_nodes_are_apart() -> None:
    kube = Patches()
    n = Nudger(kube, interval=0.02, follow_up=0.02)  # type: ignore[arg-type]
    for _ in range(50):
        n.nudge("a")
    n.nudge("b")
    await settled(n)
    assert sorted(kube.sent) == ["a", "a", "b", "b"]


async def test_a_nudge_during_the_follow_up_wait_sends_its_own_pair_and_skips_the_older_follow_up() -> None:
    kube = Patches()
    n = Nudger(kube, interval=0.05, follow_up=0.01)  # type: ignore[arg-type]
    n.nudge("a")
    await kube.went.wait()  # the first patch went: the older task now waits for its follow-up
    n.nudge("a")  # pending when the older follow-up is due: that one is skipped
    await settled(n)
    assert kube.sent == ["a", "a", "a"]


async def test_no_follow_up_when_turned_off_and_refusals_are_counted() -> None:
    kube = Patches(fail=1)
    n = Nudger(kube, interval=0.0, follow_up=0.0)  # type: ignore[arg-type]
    errors = count("first", "error")
    n.nudge("a")
    await settled(n)
    assert kube.sent == [] and n.sent == 0 and n.outcomes == {("first", "error"): 1}
    assert count("first", "error") - errors >= 1
    n.nudge("a")
    await settled(n)
    assert kube.sent == ["a"]


async def test_a_node_deleted_meanwhile_is_counted_apart_from_refusals() -> None:
    kube = Patches(fail=2, status=404)
    n = Nudger(kube, interval=0.0, follow_up=0.001)  # type: ignore[arg-type]
    gone = count("first", "gone") + count("follow_up", "gone")
    n.nudge("a")
    await settled(n)
    assert kube.sent == [] and n.outcomes == {("first", "gone"): 1, ("follow_up", "gone"): 1}
    assert count("first", "gone") + count("follow_up", "gone") - gone >= 2
