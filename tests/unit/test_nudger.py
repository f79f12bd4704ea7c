"""The Nudger's node patches: one soon after a release, a follow-up seconds later, coalesced per node.

The follow-up is what makes a freed card reach a parked pod in bounded time when kube-scheduler's retry
after the first patch met an extender whose mirror had not yet applied the release (or a retry already in
flight): without it the pod waits for kube-scheduler's 5-minute flush. The API client records the patches;
nothing else is faked. Waits are on conditions (the nudger's own tasks), never on fixed sleeps."""

from __future__ import annotations

import asyncio
from typing import Any

from controller.nudger import FREED_ANNOTATION, Nudger
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


async def test_with_no_pod_waiting_nothing_is_sent_and_a_pod_that_appears_gets_the_follow_up() -> None:
    """A patch wakes only pods waiting to be placed: with none it is not sent (each is a Node write every
    Node watcher receives). Asked when each patch is due, so a pod that appears meanwhile gets the next."""
    kube = Patches()
    waiting: list[str] = []
    asked = asyncio.Event()

    def anyone() -> bool:
        asked.set()
        return bool(waiting)

    n = Nudger(kube, interval=0.01, follow_up=0.05, someone_waits=anyone)  # type: ignore[arg-type]
    n.nudge("a")
    await settled(n)
    assert kube.sent == [] and n.outcomes == {("first", "idle"): 1, ("follow_up", "idle"): 1}
    asked.clear()
    n.nudge("a")
    await asyncio.wait_for(asked.wait(), 5)  # the first patch was due with nobody waiting
    waiting.append("uid-1")  # a pod parked after the release, seen by the watch before the follow-up
    await settled(n)
    assert kube.sent == ["a"] and n.outcomes[("follow_up", "sent")] == 1


class _NoOwner:
    moving: frozenset[str] = frozenset()

    def owner_of(self, uid: str, hint: str | None = None) -> None:
        return None


def _pod(uid: str, scheduler: str = "hami-scheduler", node: str = "", deleting: bool = False,
         phase: str = "Pending") -> dict[str, Any]:
    meta: dict[str, Any] = {"uid": uid, "name": uid, "namespace": "ns"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-03T00:00:00Z"
    spec: dict[str, Any] = {"schedulerName": scheduler, "containers": [{"name": "c"}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


async def test_the_pod_watcher_counts_as_waiting_only_live_unbound_pods_of_our_scheduler() -> None:
    from controller.pod_watch import PodWatcher
    from shared.config import Config

    w = PodWatcher(None, None, _NoOwner(), Config(), asyncio.Event())  # type: ignore[arg-type]
    w.reflector.synced.set()  # a live view (before it is listed every patch goes: see the test below)
    assert not w.nudger.someone_waits()
    for pod in (_pod("other", scheduler="default-scheduler"), _pod("bound", node="n1"),
                _pod("going", deleting=True)):
        await w.on_event("ADDED", pod)
    assert not w.nudger.someone_waits()  # another scheduler's, a bound one, one being deleted: none waits
    await w.on_event("ADDED", _pod("p1"))
    assert w.nudger.someone_waits() and w.waiting == {"p1"}
    await w.on_event("MODIFIED", _pod("p1", node="n1"))  # placed
    assert not w.nudger.someone_waits()
    await w.on_event("ADDED", _pod("p2"))
    await w.on_event("DELETED", _pod("p2"))
    await w.on_event("ADDED", _pod("p3"))
    await w.on_event("MODIFIED", _pod("p3", phase="Failed"))  # ended unbound
    assert not w.nudger.someone_waits()
    await w.on_event("ADDED", _pod("p4"))
    await w.on_sync([_pod("p5"), _pod("bound", node="n1")])  # a re-list replaces the view whole
    assert w.waiting == {"p5"}


async def test_while_the_pod_view_is_not_listed_yet_or_failing_every_patch_goes() -> None:
    """The first rebuild frees bookings, and nudges, before the pod stream has listed (its seed of the view
    comes after the ledger's rebuild, which can take longer than the interval), and a stream that fails
    misses the pods created meanwhile: such a view cannot tell that nobody waits, so the patch is sent."""
    from controller.pod_watch import PodWatcher
    from shared.config import Config

    w = PodWatcher(None, None, _NoOwner(), Config(), asyncio.Event())  # type: ignore[arg-type]
    assert w.nudger.someone_waits()  # not listed yet: the pods parked now are not in the view
    await w.on_sync([_pod("bound", node="n1")])
    w.reflector.synced.set()
    assert not w.nudger.someone_waits()  # listed, nobody waits
    w.reflector._failing(OSError("connection reset"))
    assert w.nudger.someone_waits()  # the stream is down: pods may have been parked unseen
    w.reflector._working()
    assert not w.nudger.someone_waits()


class _SlowRelease:
    """A ledger whose release waits until let go (a Redis round trip of a long re-list)."""

    def __init__(self) -> None:
        self.entered, self.go = asyncio.Event(), asyncio.Event()

    async def release(self, node: str, uid: str, give_up: object = None, ended: bool = False) -> bool:
        self.entered.set()
        await self.go.wait()
        return False


async def test_a_re_list_keeps_the_pods_waiting_in_view_while_it_is_handled() -> None:
    """on_sync awaits Redis pod by pod (a re-list of a large cluster takes seconds): a nudge due meanwhile
    (the janitor's, a knob's, a release of this very re-list) must see the pods waiting that the list holds,
    not a view emptied for the re-list and not yet refilled."""
    from controller.pod_watch import PodWatcher
    from shared.config import Config

    ledger = _SlowRelease()
    w = PodWatcher(None, ledger, _NoOwner(), Config(), asyncio.Event())  # type: ignore[arg-type]
    w.reflector.synced.set()
    await w.on_event("ADDED", _pod("p1"))
    sync = asyncio.create_task(w.on_sync([_pod("done", node="n1", phase="Succeeded"), _pod("p1")]))
    await asyncio.wait_for(ledger.entered.wait(), 5)  # the re-list is releasing its first pod
    assert w.nudger.someone_waits(), "a nudge due now is not sent: p1 waits for kube-scheduler's flush"
    ledger.go.set()
    await sync
    assert w.waiting == {"p1"}


async def test_a_gated_pod_waits_for_its_gates_not_for_a_nudge() -> None:
    """kube-scheduler does not try a pod with schedulingGates (a queue such as Kueue's may hold thousands):
    a nudge wakes none of them; the update that removes the last gate makes it a pod that waits."""
    from controller.pod_watch import PodWatcher
    from shared.config import Config

    w = PodWatcher(None, None, _NoOwner(), Config(), asyncio.Event())  # type: ignore[arg-type]
    w.reflector.synced.set()
    gated = _pod("g1")
    gated["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    await w.on_event("ADDED", gated)
    assert not w.nudger.someone_waits()
    await w.on_sync([gated])
    assert not w.nudger.someone_waits()
    await w.on_event("MODIFIED", _pod("g1"))  # ungated
    assert w.waiting == {"g1"}
