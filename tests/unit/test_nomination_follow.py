"""A nominated pod followed on the API server (InFlight.follow, controller/nominations.py `followed`).

Before: a nomination was read again only when the preempt verb had answered several nodes, three times within
10 s. A preemptor answered on one node (or learnt from a filter, an extender restarted) and then deleted, or bound
by another replica, kept its card from every pod of its priority or lower until NOMINATION_SECONDS (120 s)
passed without a filter of it, where kube-scheduler's own filters stop counting it at once; and a pod still
nominated whose victims took longer than that to go (a long grace period) lost the room kept for it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

import controller.in_flight as in_flight_module
from controller.nominations import FOLLOW_AFTER_S, NOMINATION_SECONDS, followed
from tests.unit._servers import FakeKube, extender
from tests.unit.test_nominations import slice_pod
from tests.unit.test_preempt import S4000, meta, sl, snapshot

UID = "p1"


@pytest.mark.parametrize(("pod", "settled", "verdict"), [
    (None, False, ("forget", "")),  # deleted
    ({"metadata": {"uid": "other"}, "status": {"nominatedNodeName": "a"}}, False, ("forget", "")),  # made again
    ({"metadata": {"uid": UID}, "spec": {"nodeName": "b"}}, False, ("forget", "")),  # bound (another replica)
    ({"metadata": {"uid": UID}, "spec": {"nodeName": "b"}, "status": {"nominatedNodeName": "a"}}, True,
     ("forget", "")),  # bound wins over a nomination not cleared yet
    ({"metadata": {"uid": UID}, "status": {"nominatedNodeName": "a"}}, False, ("nominate", "a")),
    ({"metadata": {"uid": UID}, "status": {"nominatedNodeName": "a"}}, True, ("nominate", "a")),
    ({"metadata": {"uid": UID}, "status": {}}, False, ("wait", "")),  # kube-scheduler may not have written it yet
    ({"metadata": {"uid": UID}, "status": {"nominatedNodeName": ""}}, True, ("forget", "")),  # nominated nowhere
    ({"metadata": {"uid": UID}, "status": {"nominatedNodeName": 7}}, True, ("forget", "")),  # not a name
    ({"metadata": {"uid": UID}, "status": None, "spec": []}, True, ("forget", "")),  # malformed parts: empty
])
def test_what_a_read_of_a_nominated_pod_says(pod: Any, settled: bool, verdict: tuple[str, str]) -> None:
    assert followed(pod, UID, settled) == verdict


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(in_flight_module, "FOLLOW_AFTER_S", (0.01, 0.01, 0.01))
    monkeypatch.setattr(in_flight_module, "FOLLOW_EVERY_S", 0.01)
    yield


class ReadCounter(FakeKube):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0
        self.tick = asyncio.Event()  # set at each read (then replaced)

    def _count(self) -> None:
        self.reads += 1
        self.tick.set()
        self.tick = asyncio.Event()

    async def get_pod(self, ns: str, name: str) -> dict[str, Any]:
        self._count()
        return await super().get_pod(ns, name)


async def reads_past(kube: ReadCounter, n: int) -> None:
    target = kube.reads + n
    async with asyncio.timeout(5):
        while kube.reads < target:
            await kube.tick.wait()


async def answered_on_one_node(ext: Any, kube: FakeKube) -> None:
    """p1 (whole card, priority 1000) answered by the preempt verb on node a only (card 0's low victim goes)."""
    from controller.preempt import Preemption

    ext.mirror.put(dataclasses.replace(snapshot([("v-a", (0,), 64, 4, 1)]), node="a"))
    p1 = slice_pod(UID, 96, 1000)
    kube.pods[("ns", "p-p1")] = p1
    out = await Preemption(ext).preempt({"Pod": p1, "NodeNameToMetaVictims": meta("a", "v-a")})
    assert set(out["NodeNameToMetaVictims"]) == {"a"}
    assert ext.filter({"Pod": slice_pod("q", 96, 10), "NodeNames": ["a"]})["NodeNames"] == []  # p1's card


async def stop_following(ext: Any) -> None:
    tasks = list(ext._following.values())
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@pytest.mark.parametrize("then", ["deleted", "bound elsewhere", "made again"])
async def test_a_one_node_answer_ends_when_its_pod_goes(fast: None, then: str) -> None:
    kube = ReadCounter()
    ext = extender(cfg=S4000, kube=kube)
    await answered_on_one_node(ext, kube)
    assert UID in ext._following  # before: read only when the answer named several nodes
    woken: list[str] = []
    ext._turned_away.add("a")
    ext._wake = woken.append  # type: ignore[method-assign]
    p1 = kube.pods[("ns", "p-p1")]
    if then == "deleted":
        del kube.pods[("ns", "p-p1")]
    elif then == "bound elsewhere":
        p1.setdefault("spec", {})["nodeName"] = "b"
    else:
        kube.pods[("ns", "p-p1")] = {**p1, "metadata": {**p1["metadata"], "uid": "p1-again"}}
    await asyncio.wait_for(asyncio.gather(*ext._following.values()), 5)
    assert not ext.nominations and not ext._following
    assert woken == ["a"]  # the pod turned away for it is tried again
    assert ext.filter({"Pod": slice_pod("q", 96, 10), "NodeNames": ["a"]})["NodeNames"] == ["a"]


async def test_a_nomination_lives_while_its_pod_names_the_node(fast: None) -> None:
    """Its victims may take longer than NOMINATION_SECONDS to go (a long grace period), with no filter of it
    meanwhile: kube-scheduler still counts it on the node, so the extender must too."""
    kube = ReadCounter()
    ext = extender(cfg=S4000, kube=kube)
    now = [0.0]
    ext.nominations.clock = lambda: now[0]
    await answered_on_one_node(ext, kube)
    kube.pods[("ns", "p-p1")]["status"] = {"nominatedNodeName": "a"}
    try:
        for _ in range(3):
            now[0] += NOMINATION_SECONDS - 1
            await reads_past(kube, 2)  # a whole read after the clock moved (the first may have begun before)
            now[0] += 2  # past the lapse of the last time it was seen, were it not seen again
            assert not ext.nominations.lapse()
            assert sorted(ext.nominations.by_node) == ["a"]
        assert ext.filter({"Pod": slice_pod("q", 96, 10), "NodeNames": ["a"]})["NodeNames"] == []
        kube.pods[("ns", "p-p1")]["status"] = {}  # kube-scheduler cleared it
        await asyncio.wait_for(asyncio.gather(*ext._following.values()), 5)
        assert not ext.nominations
    finally:
        await stop_following(ext)


async def test_a_nomination_learnt_from_a_filter_is_followed_too(fast: None) -> None:
    """An extender restarted learns a nomination from the pod's next filter only: followed from there."""
    kube = ReadCounter()
    ext = extender(cfg=S4000, kube=kube)
    ext.mirror.put(dataclasses.replace(snapshot([("y", (0,), 96, 4, 9999)]), node="a"))  # card 1 idle
    p1 = slice_pod(UID, 96, 1000, nominated="a")
    kube.pods[("ns", "p-p1")] = p1
    ext.filter({"Pod": p1, "NodeNames": ["b"]})  # not on its node: kube-scheduler tries it on others first
    assert sorted(ext.nominations.by_node) == ["a"] and UID in ext._following
    assert ext.filter({"Pod": slice_pod("q", 96, 10), "NodeNames": ["a"]})["NodeNames"] == []
    del kube.pods[("ns", "p-p1")]
    await asyncio.wait_for(asyncio.gather(*ext._following.values()), 5)
    assert not ext.nominations
    assert ext.filter({"Pod": slice_pod("q", 96, 10), "NodeNames": ["a"]})["NodeNames"] == ["a"]


async def test_a_read_that_fails_changes_nothing(fast: None) -> None:
    class Failing(ReadCounter):
        async def get_pod(self, ns: str, name: str) -> dict[str, Any]:
            self._count()
            raise OSError("unreachable")

    kube = Failing()
    ext = extender(cfg=S4000, kube=kube)
    await answered_on_one_node(ext, kube)
    try:
        await reads_past(kube, len(FOLLOW_AFTER_S) + 2)
        assert sorted(ext.nominations.by_node) == ["a"]  # neither forgotten nor moved: it lapses on its own
    finally:
        await stop_following(ext)


async def test_followed_pods_are_bounded(fast: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(in_flight_module, "MAX_FOLLOWED", 2)
    kube = FakeKube()
    ext = extender(cfg=S4000, kube=kube)
    try:
        for i in range(4):
            ext.nominate(f"u{i}", 1000, sl(96), {}, ["a"])
            kube.pods[("ns", f"u{i}")] = {"metadata": {"uid": f"u{i}"}, "status": {"nominatedNodeName": "a"}}
            ext.follow("ns", f"u{i}", f"u{i}")
            ext.follow("ns", f"u{i}", f"u{i}")  # one follower per pod
        assert sorted(ext._following) == ["u0", "u1"]
    finally:
        await stop_following(ext)
