"""A nominated pod followed on the API server (InFlight.follow, controller/nominations.py `followed`).

Before: a nomination was read again only when the preempt verb had answered several nodes, three times within
10 s. A preemptor answered on one node (or learnt from a filter, an extender restarted) and then deleted, or bound
by another replica, kept its card from every pod of its priority or lower until NOMINATION_SECONDS (120 s)
passed without a filter of it, where kube-scheduler's own filters stop counting it at once; and a pod still
nominated whose victims took longer than that to go (a long grace period) lost the room kept for it.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

import controller.in_flight as in_flight_module
from controller.nominations import FOLLOW_AT_S, FOLLOW_EVERY_S, NOMINATION_SECONDS, followed, read_times
from controller.preempt import Preemption
from shared.kube import KubeError
from tests.e2e._wait import until_true
from tests.unit._servers import FakeKube, extender
from tests.unit.test_nominations import slice_pod
from tests.unit.test_preempt import S4000, meta, sl, snapshot

UID = "p1"


@pytest.mark.parametrize(("pod", "settled", "verdict"), [
    ({"metadata": {"uid": UID, "deletionTimestamp": "2026-12-06T00:00:00Z"}, "status": {"nominatedNodeName": "a"}},
     False, ("forget", "")),  # being deleted: kube-scheduler schedules no such pod
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


@pytest.mark.parametrize(("named", "settled", "verdict"), [
    ("b", False, ("nominate", "b")),  # kube-scheduler's choice among the nodes answered
    ("a", False, ("wait", "")),  # its nomination from before the answer: the choice is not written yet
    ("a", True, ("nominate", "a")),  # still so at the settled read: kube-scheduler chose a after all
    ("", False, ("wait", "")),
])
def test_a_read_after_an_answer_waits_for_one_of_its_nodes(named: str, settled: bool,
                                                           verdict: tuple[str, str]) -> None:
    """Red team: a follower reading between the verb's answer and kube-scheduler's status write saw the node of the
    pod's earlier nomination, moved the new one back there, and lost the victims answered."""
    pod = {"metadata": {"uid": UID}, "status": {"nominatedNodeName": named}}
    assert followed(pod, UID, settled, answered={"b", "c"}) == verdict


def test_reads_come_at_the_times_the_docs_say() -> None:
    """docs/rules.md: 1, 3 and 10 s after the extender learnt the nomination, then every 10 s (red team: the first
    version slept each delay after the last, reading at 1, 4 and 14 s)."""
    times = read_times(FOLLOW_AT_S, FOLLOW_EVERY_S)
    assert [next(times) for _ in range(6)] == [1.0, 3.0, 10.0, 20.0, 30.0, 40.0]


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(in_flight_module, "FOLLOW_AT_S", (0.01, 0.02, 0.03))
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
        await reads_past(kube, len(FOLLOW_AT_S) + 2)
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


# -- from the red team of the first version ------------------------------------------------------------------------


class Scripted(FakeKube):
    """Each read of a pod waits for the answer the test gives it (a pod, or None: not found)."""

    def __init__(self) -> None:
        super().__init__()
        self.asks: asyncio.Queue[asyncio.Future[Any]] = asyncio.Queue()

    async def get_pod(self, ns: str, name: str) -> dict[str, Any]:
        asked = asyncio.get_running_loop().create_future()
        await self.asks.put(asked)
        got = await asked
        if got is None:
            raise KubeError(404, {"message": f'pods "{name}" not found'}, "get")
        return copy.deepcopy(got)  # type: ignore[no-any-return]

    async def reply(self, pod: Any) -> None:
        """Answer the next read with `pod`; return once its follower acted on it."""
        async with asyncio.timeout(5):
            while (asked := await self.asks.get()).done():
                pass  # the read of a follower cancelled since
        asked.set_result(pod)
        for _ in range(5):  # the follower wakes at the next loop turn and acts on the answer before it awaits again
            await asyncio.sleep(0)


def named(node: str, uid: str = UID) -> dict[str, Any]:
    return {"metadata": {"uid": uid}, "status": {"nominatedNodeName": node} if node else {}}


@pytest.fixture
def instant(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(in_flight_module, "FOLLOW_AT_S", (0.0, 0.0, 0.0))
    monkeypatch.setattr(in_flight_module, "FOLLOW_EVERY_S", 0.0)


def three_nodes(ext: Any) -> None:
    for name in "abc":  # card 0 held by a low-priority victim v-<node>, card 1 idle
        ext.mirror.put(dataclasses.replace(snapshot([(f"v-{name}", (0,), 64, 4, 1)]), node=name))


async def test_a_new_answer_is_not_moved_back_by_a_read_of_the_old_nomination(instant: None) -> None:
    """p1, nominated to a, preempts again and is answered on b and c. A read between the answer and
    kube-scheduler's status write still sees a: the first version moved the new nomination back to a (b and c
    kept nothing for p1) and, once b was written, kept b without the victims answered there."""
    kube = Scripted()
    ext = extender(cfg=S4000, kube=kube)
    three_nodes(ext)
    p1 = slice_pod(UID, 96, 1000, nominated="a")
    ext.filter({"Pod": p1, "NodeNames": ["zz"]})  # learnt from a filter: followed
    try:
        await kube.reply(named("a"))
        assert sorted(ext.nominations.by_node) == ["a"]
        out = await Preemption(ext).preempt({"Pod": {**p1, "status": {}},
                                             "NodeNameToMetaVictims": {**meta("b", "v-b"), **meta("c", "v-c")}})
        assert set(out["NodeNameToMetaVictims"]) == {"b", "c"}
        await kube.reply(named("a"))  # kube-scheduler's write not landed yet
        assert dict(ext.nominations.by_uid[UID].victims) == {"b": ("v-b",), "c": ("v-c",)}
        await kube.reply(named("b"))
        assert dict(ext.nominations.by_uid[UID].victims) == {"b": ("v-b",)}
    finally:
        await stop_following(ext)


async def test_a_new_answer_is_not_forgotten_by_a_follower_of_an_earlier_nomination(
        instant: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """kube-scheduler cleared p1's nomination; its next filter came without it (forgotten) and the verb answered b.
    The first version left the earlier follower running, past its first reads: its next read, before
    kube-scheduler wrote b, counted as settled and forgot the new nomination. An answer starts the reads afresh."""
    monkeypatch.setattr(in_flight_module, "FOLLOW_EVERY_S", 30.0)  # past its first reads it sleeps meanwhile
    kube = Scripted()
    ext = extender(cfg=S4000, kube=kube)
    three_nodes(ext)
    p1 = slice_pod(UID, 96, 1000, nominated="a")
    ext.filter({"Pod": p1, "NodeNames": ["zz"]})
    try:
        for _ in FOLLOW_AT_S:  # past its first reads
            await kube.reply(named("a"))
        ext.filter({"Pod": {**p1, "status": {}}, "NodeNames": ["zz"]})
        assert not ext.nominations
        out = await Preemption(ext).preempt({"Pod": {**p1, "status": {}}, "NodeNameToMetaVictims": meta("b", "v-b")})
        assert set(out["NodeNameToMetaVictims"]) == {"b"}
        await kube.reply(named(""))  # not written yet
        assert sorted(ext.nominations.by_node) == ["b"]
        await kube.reply(named("b"))
        assert sorted(ext.nominations.by_node) == ["b"]
    finally:
        await stop_following(ext)


async def test_pods_nominated_for_long_never_keep_an_answer_from_being_narrowed(
        fast: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """MAX_FOLLOWED (here 2) pods whose victims are slow to go stay followed; the first version counted them in
    the same budget, so a later answer on several nodes was never narrowed (every node answered kept a card from
    lower pods until the preemptor's next filter, or 120 s). The first reads have a budget of their own."""
    monkeypatch.setattr(in_flight_module, "MAX_FOLLOWED", 2)
    kube = FakeKube()
    ext = extender(cfg=S4000, kube=kube)
    three_nodes(ext)
    try:
        for i in range(2):
            ext.nominate(f"u{i}", 5000, sl(96), {}, ["x"])
            kube.pods[("ns", f"u{i}")] = named("x", f"u{i}")
            ext.follow("ns", f"u{i}", f"u{i}")

        async def long_followed() -> bool:
            return ext._followed_long == {"u0", "u1"}

        await until_true(long_followed, "both followed past their first reads", timeout=5)
        p1 = slice_pod(UID, 96, 1000)
        kube.pods[("ns", "p-p1")] = p1
        out = await Preemption(ext).preempt(
            {"Pod": p1, "NodeNameToMetaVictims": {**meta("a", "v-a"), **meta("b", "v-b"), **meta("c", "v-c")}})
        assert set(out["NodeNameToMetaVictims"]) == {"a", "b", "c"}
        p1["status"] = {"nominatedNodeName": "a"}  # kube-scheduler's choice

        async def narrowed() -> bool:
            return sorted(ext.nominations.by_node) == ["a", "x"]

        await until_true(narrowed, "p1 narrowed to a", timeout=5)
    finally:
        await stop_following(ext)


async def test_a_follower_that_ended_is_replaced_at_once(fast: None) -> None:
    """Red team: a follower done but not yet removed (its done-callback runs a loop turn later) made a follow
    asked in that turn a no-op, and the new nomination went unfollowed."""
    kube = FakeKube()
    ext = extender(cfg=S4000, kube=kube)
    ended = asyncio.get_running_loop().create_task(asyncio.sleep(0))
    await ended
    ext._following[UID] = ended  # as the done-callback has not removed it yet
    ext.nominate(UID, 1000, sl(96), {}, ["a"])
    kube.pods[("ns", "p-p1")] = named("a")
    ext.follow("ns", "p-p1", UID)
    try:
        assert ext._following[UID] is not ended
    finally:
        await stop_following(ext)


async def test_a_new_answer_for_a_pod_followed_long_keeps_the_first_reads_bounded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Red team: an answer for a pod followed past its first reads started its reads afresh even when MAX_FOLLOWED
    pods were in their first reads already: one more there per such answer (up to twice MAX_FOLLOWED). With no
    room the earlier follower ends (it would read kube-scheduler's old choice) and the nomination lapses as one not
    followed; a pod in its first reads is still restarted in its own place."""
    monkeypatch.setattr(in_flight_module, "MAX_FOLLOWED", 2)
    monkeypatch.setattr(in_flight_module, "FOLLOW_AT_S", (0.0, 0.0, 0.0))
    monkeypatch.setattr(in_flight_module, "FOLLOW_EVERY_S", 30.0)  # past its first reads a follower sleeps

    class Held(FakeKube):
        """Reads of the pods named f* are answered only once the test ends: they stay in their first reads."""

        def __init__(self) -> None:
            super().__init__()
            self.gate = asyncio.Event()

        async def get_pod(self, ns: str, name: str) -> dict[str, Any]:
            if name.startswith("f"):
                await self.gate.wait()
            return await super().get_pod(ns, name)

    kube = Held()
    ext = extender(cfg=S4000, kube=kube)

    def first_reads() -> int:
        return len(ext._following) - len(ext._followed_long)

    try:
        for uid in ("u0", "u1", "f0", "f1"):
            ext.nominate(uid, 1000, sl(96), {}, ["x"])
            kube.pods[("ns", uid)] = named("x", uid)
            ext.follow("ns", uid, uid)

            async def settled(uid: str = uid) -> bool:
                return uid.startswith("f") or uid in ext._followed_long

            await until_true(settled, f"{uid} past its first reads", timeout=5)
        assert ext._followed_long == {"u0", "u1"} and first_reads() == 2
        for uid in ("u0", "u1"):  # each answered again (say on y): no room for their first reads
            old = ext._following[uid]
            ext.nominate(uid, 1000, sl(96), {}, {"y": ()})
            ext.follow("ns", uid, uid, answered={"y"})
            assert first_reads() <= 2, sorted(ext._following)
            assert uid not in ext._following  # the earlier follower does not read on: it would move y back to x
            with pytest.raises(asyncio.CancelledError):
                await old
        assert sorted(ext.nominations.by_node) == ["x", "y"]  # kept, lapsing on its own
        old = ext._following["f0"]
        ext.follow("ns", "f0", "f0", answered={"y"})  # a pod in its first reads: restarted in its own place
        assert ext._following["f0"] is not old and first_reads() == 2
    finally:
        kube.gate.set()
        await stop_following(ext)


async def test_an_answer_replaces_an_ended_follower_in_its_own_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """The budget counts the pods in their first reads besides this one: a follower of its own that ended (its
    done-callback not run yet) at a full budget gave up the new answer's reads, though the new one takes its place."""
    monkeypatch.setattr(in_flight_module, "MAX_FOLLOWED", 1)
    kube = FakeKube()
    ext = extender(cfg=S4000, kube=kube)
    ended = asyncio.get_running_loop().create_task(asyncio.sleep(0))
    await ended
    ext._following[UID] = ended  # as the done-callback has not removed it yet
    ext.nominate(UID, 1000, sl(96), {}, {"a": ()})
    kube.pods[("ns", "p-p1")] = named("")
    ext.follow("ns", "p-p1", UID, answered={"a"})
    try:
        assert ext._following[UID] is not ended
    finally:
        await stop_following(ext)


async def test_followers_leave_the_api_clients_connections_to_binds(fast: None) -> None:
    """Red team: every follower read at once, up to 2 x MAX_FOLLOWED (128) reads in flight on an API server slow to
    answer, where the API client has 64 connections (shared/kube.py Kube.create) and a Binding gets BIND_CONNECT_S
    to get one: binds failed for reads that could wait. At most MAX_FOLLOW_READS are in flight, as Events have
    BEST_EFFORT_IN_FLIGHT; the others wait their turn."""
    class Slow(FakeKube):
        def __init__(self) -> None:
            super().__init__()
            self.gate = asyncio.Event()
            self.in_flight = self.most = 0

        async def get_pod(self, ns: str, name: str) -> dict[str, Any]:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            try:
                await self.gate.wait()
                return await super().get_pod(ns, name)
            finally:
                self.in_flight -= 1

    kube = Slow()
    ext = extender(cfg=S4000, kube=kube)
    n = in_flight_module.MAX_FOLLOWED
    try:
        for i in range(n):
            ext.nominate(f"u{i}", 1000, sl(96), {}, ["a"])
            kube.pods[("ns", f"u{i}")] = named("", f"u{i}")  # nominated nowhere: forgotten at the settled read
            ext.follow("ns", f"u{i}", f"u{i}")
        assert len(ext._following) == n

        async def all_waiting() -> bool:  # every follower is reading or waiting its turn
            return kube.in_flight >= in_flight_module.MAX_FOLLOW_READS or kube.most > in_flight_module.MAX_FOLLOW_READS

        await until_true(all_waiting, "the reads begin", timeout=5)
        for _ in range(10):  # loop turns: any follower that could start a read has started it
            await asyncio.sleep(0)
        assert kube.most <= in_flight_module.MAX_FOLLOW_READS < n, kube.most
        kube.gate.set()  # answered: every follower reads in its turn, to its end

        async def all_done() -> bool:
            return not ext._following

        await until_true(all_done, "every nomination read to its end", timeout=10)
        assert not ext.nominations
    finally:
        kube.gate.set()
        await stop_following(ext)
