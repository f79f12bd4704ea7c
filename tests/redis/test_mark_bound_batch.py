"""Binds answered together are confirmed together: one mark_bound call and one feed message per node and batch
(shared/store/lua/mark_bound.lua `uids`, Ledger.mark_bound_many, controller/confirm.py Confirmations._confirm), on a
real redis-server."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from controller.extender import Extender
from shared.store.ledger import MARK_BOUND_MAX, Ledger
from tests.redis.conftest import MirrorFactory
from tests.redis.helpers import dump, eventually
from tests.redis.test_extender_bind import FakeKube, pod
from tests.redis.test_extender_bind import setup as setup  # the fixture, reused

SLICE = {"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 8, "mthreads.com/sgpu-core": 2}


async def feed_messages(redis: Redis, feed: str) -> tuple[object, list[dict[str, object]]]:
    """A subscriber on the feed and the list its messages are appended to (decoded)."""
    got: list[dict[str, object]] = []
    pubsub = redis.pubsub()
    await pubsub.subscribe(feed)

    async def read() -> None:
        async for m in pubsub.listen():
            if m["type"] == "message":
                got.append(orjson.loads(m["data"]))

    return asyncio.create_task(read()), got


@pytest.mark.redis
async def test_one_call_marks_many_with_one_message_and_names_the_missing(cluster: Ledger) -> None:
    led = cluster
    for i in range(3):
        assert (await led.reserve("n4", f"b{i}", [i % 2], 8, 1, 1, pod=f"ns/p{i}"))[0].ok
    assert await led.mark_bound("n4", "b0")  # already bound: left as it is
    before = (await led.snapshot("n4")).version  # type: ignore[union-attr]
    bound_at = (await led.snapshot("n4")).reservations["b0"].bound_at  # type: ignore[union-attr]
    reader, got = await feed_messages(led.redis, led.feed)
    try:
        trips = led.round_trips
        missing = await led.mark_bound_many("n4", ["b0", "b1", "gone", "b2"])
        assert missing == ["gone"] and led.round_trips - trips == 1
        snap = await led.snapshot("n4")
        assert snap is not None and snap.version == before + 2  # one version per reservation it changed
        assert {u: r.state for u, r in snap.reservations.items()} == dict.fromkeys(("b0", "b1", "b2"), "bound")
        assert snap.reservations["b0"].bound_at == bound_at
        await eventually(lambda: len(got) == 1, what="the batch's feed message")
        (msg,) = got
        assert msg["kind"] == "bound" and msg["uid"] == "b1" and msg["version"] == before + 2
        assert sorted(msg["more"]) == ["b2"] and msg["span"] == 2  # type: ignore[arg-type]
        # the same again: nothing left to change, no write, no message
        assert await led.mark_bound_many("n4", ["b1", "b2"]) == []
        assert (await led.snapshot("n4")).version == before + 2  # type: ignore[union-attr]
        assert await led.mark_bound_many("n4", ["gone", "nobody"]) == ["gone", "nobody"]
    finally:
        reader.cancel()  # type: ignore[attr-defined]
    assert len(got) == 1


@pytest.mark.redis
async def test_a_batch_is_bounded_and_checked_whole_before_anything_changes(cluster: Ledger) -> None:
    led = cluster
    assert (await led.reserve("n4", "ok1", [0], 8, 1, 1))[0].ok
    with pytest.raises(ValueError):
        await led.mark_bound_many("n4", [f"u{i}" for i in range(MARK_BOUND_MAX + 1)])
    with pytest.raises(ValueError):
        await led.mark_bound_many("n4", [])
    before = await dump(led.redis)
    script = led._scripts["mark_bound"]
    for payload in ({"uids": [f"u{i}" for i in range(MARK_BOUND_MAX + 1)]}, {"uids": []}, {"uids": ["ok1", "bad uid"]},
                    {"uids": "ok1"}, {"uids": ["ok1", 7]}):
        with pytest.raises(ResponseError, match="BADINPUT"):
            await script(led.keys.mark_bound("n4", "ok1"), (led.feed, "n4", orjson.dumps(payload).decode()))
    assert await dump(led.redis) == before  # "ok1" stayed pending: a bad entry refuses the whole call


@pytest.mark.redis
async def test_a_mirror_applies_every_reservation_of_a_batch(cluster: Ledger, mirror_factory: MirrorFactory) -> None:
    led = cluster
    m = await mirror_factory()
    for i in range(4):
        assert (await led.reserve("n5", f"m{i}", [i % 2], 16, 2, 1))[0].ok
    await led.mark_bound_many("n5", [f"m{i}" for i in range(4)])
    snap = await led.snapshot("n5")
    await eventually(lambda: m.get("n5") == snap, what="the mirror has the batch")
    assert {r.state for r in m.get("n5").reservations.values()} == {"bound"}  # type: ignore[union-attr]
    assert m.refetches == 0  # applied from the one message, not re-read


@pytest.mark.redis
async def test_binds_answered_together_are_confirmed_in_one_call(
        setup: tuple[Extender, FakeKube, Ledger]) -> None:
    ext, kube, ledger = setup
    uids = [f"t{i}" for i in range(5)]
    for uid in uids:
        ext.filter({"Pod": pod(uid, SLICE), "NodeNames": ["s5k"], "Nodes": None})
    calls: list[list[str]] = []
    real = ledger.mark_bound_many

    async def counted(node: str, batch: list[str]) -> list[str]:
        calls.append(list(batch))
        return await real(node, batch)

    ledger.mark_bound_many = counted  # type: ignore[method-assign]
    answers = await asyncio.gather(*(ext.bind({"PodName": f"p-{u}", "PodNamespace": "ns", "PodUID": u,
                                               "Node": "s5k"}) for u in uids))
    assert answers == [{"Error": ""}] * 5 and len(kube.bound) == 5
    await ext.settled()
    assert [sorted(c) for c in calls] == [uids]  # one call for the five binds answered within the linger
    snap = await ledger.snapshot("s5k")
    assert snap is not None and {snap.reservations[u].state for u in uids} == {"bound"}
    assert not ext.confirms._confirming and not ext.confirms._settling


@pytest.mark.redis
async def test_a_booking_gone_from_a_batch_is_handled_alone_and_the_others_are_bound(
        setup: tuple[Extender, FakeKube, Ledger]) -> None:
    ext, kube, ledger = setup
    for uid in ("k1", "k2"):
        ext.filter({"Pod": pod(uid, SLICE), "NodeNames": ["s5k"], "Nodes": None})
    rebooked: list[str] = []
    real = ext.confirms._rebook

    async def rebook(node: str, uid: str, *rest: object) -> None:
        rebooked.append(uid)
        await real(node, uid, *rest)  # type: ignore[arg-type]

    ext.confirms._rebook = rebook  # type: ignore[method-assign]
    for uid in ("k1", "k2"):
        assert await ext.bind({"PodName": f"p-{uid}", "PodNamespace": "ns", "PodUID": uid, "Node": "s5k"}) == {
            "Error": ""}
    assert await ledger.release("s5k", "k1")  # released (a repair) while its confirmation waits
    # the API server has k1 bound there with its record: the pod holds its cards
    kube.pods[("ns", "p-k1")] = {"metadata": {"name": "p-k1", "namespace": "ns", "uid": "k1",
                                              "annotations": kube.bound[0][3]}, "spec": {"nodeName": "s5k"}}
    await ext.settled()
    assert rebooked == ["k1"]  # the gone one alone; FakeKube still has it bound, so it is booked again
    snap = await ledger.snapshot("s5k")
    assert snap is not None and snap.reservations["k2"].state == "bound"
    assert snap.reservations["k1"].state == "bound"  # booked again from its record (observe keep_bound)


@pytest.mark.redis
async def test_a_mirror_takes_a_batch_only_onto_the_version_before_it(cluster: Ledger,
                                                                      mirror_factory: MirrorFactory) -> None:
    """`span` counts the batch's versions: applied onto the version before them, a gap otherwise (re-read);
    a span that is not 1..512 is a malformed message (the node is re-read too)."""
    assert await cluster.nodes()  # the mirror below starts with n4 in it
    m = await mirror_factory()
    cur = m.get("n4")
    assert cur is not None
    msg = {"node": "n4", "version": cur.version + 3, "stamp": "9.1", "prev": cur.stamp, "kind": "bound",
           "full": False, "cards": {}, "error": "", "uid": "x1", "res": False, "more": {}, "span": 2}
    assert m.apply(msg) == "n4"  # one version of this history is missing: re-read, nothing applied
    assert m.get("n4") is cur
    for bad in (0, 513, "2", True, 1.5):
        with pytest.raises(ValueError):
            m.apply({**msg, "version": cur.version + 2, "span": bad})
    assert m.get("n4") is cur
