"""The extender's verbs against a real Redis ledger and mirror. The API server is replaced by a
recording stand-in only to provoke failures the real one cannot be made to produce on demand
(the e2e suite proves the happy path against the real kube-apiserver and kube-scheduler)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest
from redis.asyncio import Redis

from controller.extender import Extender
from shared.config import load_config
from shared.domain.annotations import ALLOCATED, GPU_INDEX, decode_allocation
from shared.domain.node import node_inventory
from shared.kube import KubeError
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis.helpers import hold_confirmations

pytestmark = pytest.mark.redis
CFG = load_config(env={}, flags={"memoryPerCard": "96,160"})


class FakeKube:
    """Records Bindings; `fail_with` makes the next bind fail like the API server would."""

    def __init__(self) -> None:
        self.bound: list[tuple[str, str, str, dict[str, str]]] = []
        self.fail_with: KubeError | None = None
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.events: list[tuple[str, str]] = []
        self.deadlines: list[float | None] = []  # each Binding's `until` (time.monotonic(): committed by then or never)

    async def bind(self, ns: str, name: str, uid: str, node: str, annotations: Mapping[str, str],
                   until: float | None = None) -> None:
        self.deadlines.append(until)
        if self.fail_with:
            raise self.fail_with
        self.bound.append((f"{ns}/{name}", uid, node, dict(annotations)))

    async def get_pod(self, ns: str, name: str) -> dict[str, Any]:
        if (ns, name) not in self.pods:
            raise KubeError(404, {"message": "not found"}, "get")
        return self.pods[(ns, name)]

    async def create_event(self, pod: Any, reason: str, message: str, kind: str, component: str) -> None:
        self.events.append((reason, message))


def node(name: str, units: int, cards: int) -> dict[str, Any]:
    cap = {"mthreads.com/sgpu-core": str(16 * cards), "mthreads.com/sgpu-memory": str(units * cards)}
    return {"metadata": {"name": name}, "status": {"capacity": cap}}


def pod(uid: str, limits: dict[str, Any], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": f"p-{uid}", "namespace": "ns", "uid": uid, "annotations": annotations or {}},
            "spec": {"schedulerName": "hami-scheduler",  # as admission leaves it: bind places only our pods
                     "containers": [{"name": "c", "resources": {"limits": {k: str(v) for k, v in limits.items()}}}]}}


@pytest.fixture
async def setup(redis_client: Redis, ledger: Ledger) -> AsyncIterator[tuple[Extender, FakeKube, Ledger]]:
    for n in (node("s4k", 96, 2), node("s5k", 160, 2)):
        await ledger.upsert_node(node_inventory(n, CFG))
    mirror = Mirror(ledger)
    await mirror.start()
    await asyncio.wait_for(mirror.ready.wait(), 5)
    kube = FakeKube()
    ext = Extender(CFG, ledger, mirror, kube)  # type: ignore[arg-type]
    yield ext, kube, ledger
    await ext.settled()  # no confirmation of this test's binds runs into the next test's Redis
    await mirror.stop()


async def settle(ext: Extender, node_name: str, version: int) -> None:
    for _ in range(100):
        snap = ext.mirror.get(node_name)
        if snap and snap.version >= version:
            return
        await asyncio.sleep(0.01)


async def test_filter_reports_hami_reasons_and_prioritize_scores(setup: tuple[Extender, FakeKube, Ledger]) -> None:
    ext, _kube, _ = setup
    p = pod("u1", {"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 128, "mthreads.com/sgpu-core": 4})
    out = ext.filter({"Pod": p, "NodeNames": ["s4k", "s5k", "ghost"], "Nodes": None})
    assert out["NodeNames"] == ["s5k"]
    assert out["FailedNodes"] == {"s4k": "2/2 CardTypeMismatch"}
    assert out["FailedAndUnresolvableNodes"] == {"ghost": "node unregistered"}
    scores = ext.prioritize({"Pod": p, "NodeNames": ["s4k", "s5k"]})
    assert {s["Host"] for s in scores} == {"s4k", "s5k"} and all(isinstance(s["Score"], int) for s in scores)


async def test_filter_fails_closed_on_bad_requests(setup: tuple[Extender, FakeKube, Ledger]) -> None:
    ext, _kube, _ = setup
    # an admission bypass: a slice value no model accepts must not be placed anywhere
    p = pod("u2", {"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": "1.5"})
    out = ext.filter({"Pod": p, "NodeNames": ["s4k", "s5k"], "Nodes": None})
    assert out["NodeNames"] == [] and set(out["FailedAndUnresolvableNodes"]) == {"s4k", "s5k"}
    assert "not a whole number" in out["FailedAndUnresolvableNodes"]["s4k"]


async def test_filter_with_full_node_objects(setup: tuple[Extender, FakeKube, Ledger]) -> None:
    ext, _, _ = setup
    p = pod("u3", {"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 96, "mthreads.com/sgpu-core": 16})
    nodes = {"items": [{"metadata": {"name": "s4k"}}, {"metadata": {"name": "s5k"}}]}
    out = ext.filter({"Pod": p, "Nodes": nodes, "NodeNames": None})
    assert out["NodeNames"] is None and [n["metadata"]["name"] for n in out["Nodes"]["items"]] == ["s4k"]


async def test_bind_books_writes_the_record_and_is_idempotent(setup: tuple[Extender, FakeKube, Ledger]) -> None:
    ext, kube, ledger = setup
    p = pod("u4", {"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 32, "mthreads.com/sgpu-core": 8})
    ext.filter({"Pod": p, "NodeNames": ["s5k"], "Nodes": None})
    before = ledger.round_trips
    out = await ext.bind({"PodName": "p-u4", "PodNamespace": "ns", "PodUID": "u4", "Node": "s5k"})
    assert out == {"Error": ""}
    await ext.settled()  # the booking is marked bound after the answer
    assert ledger.round_trips - before == 2  # reserve + mark bound
    (ref, uid, node_name, ann), = kube.bound
    (grant,), = decode_allocation(ann[ALLOCATED])
    assert (ref, uid, node_name) == ("ns/p-u4", "u4", "s5k")
    assert grant.memory_mib == 32 * 512 and grant.cores == 8 and ann[GPU_INDEX] == str(grant.index)
    snap = await ledger.snapshot("s5k")
    assert snap is not None and snap.reservations["u4"].state == "bound"
    assert snap.cards[grant.index].mem_used == 32
    # a retried bind (e.g. after a timeout) books nothing twice
    kube.pods[("ns", "p-u4")] = p
    assert (await ext.bind({"PodName": "p-u4", "PodNamespace": "ns", "PodUID": "u4", "Node": "s5k"}))["Error"] == ""
    snap = await ledger.snapshot("s5k")
    assert snap is not None and sum(c.mem_used for c in snap.cards.values()) == 32


async def test_failed_binding_releases_the_reservation(setup: tuple[Extender, FakeKube, Ledger]) -> None:
    ext, kube, ledger = setup
    p = pod("u5", {"mthreads.com/vgpu": 2, "mthreads.com/sgpu-memory": 192, "mthreads.com/sgpu-core": 32})
    kube.pods[("ns", "p-u5")] = p  # filter ran on another replica: bind reads the pod
    kube.fail_with = KubeError(409, {"message": "pod p-u5 is being deleted"}, "bind")
    out = await ext.bind({"PodName": "p-u5", "PodNamespace": "ns", "PodUID": "u5", "Node": "s4k"})
    assert "failed, reservation released" in out["Error"] and "being deleted" in out["Error"]
    snap = await ledger.snapshot("s4k")
    assert snap is not None and not snap.reservations
    assert all(c.mem_used == 0 and c.cores_used == 0 for c in snap.cards.values())
    await wait_events(kube, "BindingFailed")


async def test_bind_refuses_when_the_card_is_gone(setup: tuple[Extender, FakeKube, Ledger]) -> None:
    ext, kube, _ledger = setup
    # two exclusive S4000 pods race for two cards, a third finds none: an error, nothing bound
    for uid in ("a", "b", "c"):
        kube.pods[("ns", f"p-{uid}")] = pod(uid, {"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 96,
                                                  "mthreads.com/sgpu-core": 16})
    results = await asyncio.gather(*(ext.bind({"PodName": f"p-{u}", "PodNamespace": "ns", "PodUID": u,
                                               "Node": "s4k"}) for u in ("a", "b", "c")))
    errors = [r["Error"] for r in results if r["Error"]]
    assert len(kube.bound) == 2 and len(errors) == 1 and "no card on s4k" in errors[0]
    cards = {ann[GPU_INDEX] for _, _, _, ann in kube.bound}
    assert cards == {"0", "1"}


async def test_a_booking_reaches_the_mirror_with_the_reserve_reply_not_later(redis_client: Redis,
                                                                            ledger: Ledger) -> None:
    """The reserve script returns the feed message it published; bind applies it at once, so the next pod's
    filter sees the card taken even when the feed is slow (here: no feed at all, the mirror only resynced)."""
    await ledger.upsert_node(node_inventory(node("s5k", 160, 2), CFG))
    mirror = Mirror(ledger)
    await mirror.resync()  # the mirror's state, without its feed task: nothing arrives by Pub/Sub
    mirror.ready.set()
    kube = FakeKube()
    ext = Extender(CFG, ledger, mirror, kube)  # type: ignore[arg-type]
    first = pod("w1", {"mthreads.com/vgpu": 1})  # an exclusive card
    ext.filter({"Pod": first, "NodeNames": ["s5k"]})
    before = mirror.get("s5k")
    assert before is not None
    assert (await ext.bind({"PodName": "p-w1", "PodNamespace": "ns", "PodUID": "w1", "Node": "s5k"}))["Error"] == ""
    after = mirror.get("s5k")
    assert after is not None and after.version == before.version + 1 and "w1" in after.reservations
    assert ext.held == {}  # nothing held once the mirror has the booking
    truth = await ledger.snapshot("s5k")
    assert truth is not None and after.cards == truth.cards  # the cards exactly as the ledger holds them
    out = ext.filter({"Pod": pod("w2", {"mthreads.com/vgpu": 1}), "NodeNames": ["s5k"]})
    assert out["NodeNames"] == ["s5k"]  # the second card is still idle
    assert (await ext.bind({"PodName": "p-w2", "PodNamespace": "ns", "PodUID": "w2", "Node": "s5k"}))["Error"] == ""
    out = ext.filter({"Pod": pod("w3", {"mthreads.com/vgpu": 1}), "NodeNames": ["s5k"]})
    assert out["NodeNames"] == [] and "2/2 ExclusiveDeviceAllocateConflict" in out["FailedNodes"]["s5k"]


async def wait_events(kube: FakeKube, reason: str) -> list[tuple[str, str]]:
    """The events sent so far, once one with `reason` is among them (events are sent in the background)."""
    for _ in range(500):
        if any(r == reason for r, _ in kube.events):
            return list(kube.events)
        await asyncio.sleep(0.01)
    raise AssertionError(f"no {reason} event: {kube.events}")


@pytest.mark.parametrize("success_events", [False, True])
async def test_a_successful_bind_sends_its_event_only_when_asked(redis_client: Redis, ledger: Ledger,
                                                                 success_events: bool) -> None:
    cfg = load_config(env={}, flags={"memoryPerCard": "96,160", "successEvents": str(success_events).lower()})
    await ledger.upsert_node(node_inventory(node("s5k", 160, 1), cfg))
    mirror = Mirror(ledger)
    await mirror.start()
    try:
        await asyncio.wait_for(mirror.ready.wait(), 5)
        kube = FakeKube()
        ext = Extender(cfg, ledger, mirror, kube)  # type: ignore[arg-type]
        ok = pod("ok", {"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 32, "mthreads.com/sgpu-core": 4})
        ext.filter({"Pod": ok, "NodeNames": ["s5k"], "Nodes": None})
        assert await ext.bind({"PodName": "p-ok", "PodNamespace": "ns", "PodUID": "ok", "Node": "s5k"}) == {"Error": ""}
        # then a bind that fails: its event is sent after the success's (if any), so once it is there
        # the success event is there too, or never will be
        big = pod("big", {"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 160, "mthreads.com/sgpu-core": 16})
        kube.pods[("ns", "p-big")] = big
        assert (await ext.bind({"PodName": "p-big", "PodNamespace": "ns", "PodUID": "big", "Node": "s5k"}))["Error"]
        events = await wait_events(kube, "BindingFailed")
        succeeded = [m for r, m in events if r == "BindingSucceed"]
        assert succeeded == (["Successfully binding node [s5k] to ns/p-ok (cards 0)"] if success_events else [])
    finally:
        await mirror.stop()


async def test_bind_answers_once_the_binding_exists_and_marks_the_booking_bound_after(
        setup: tuple[Extender, FakeKube, Ledger], monkeypatch: pytest.MonkeyPatch) -> None:
    ext, kube, ledger = setup
    go = hold_confirmations(ledger, monkeypatch)
    p = pod("s1", {"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 32, "mthreads.com/sgpu-core": 4})
    ext.filter({"Pod": p, "NodeNames": ["s5k"], "Nodes": None})
    out = await asyncio.wait_for(ext.bind({"PodName": "p-s1", "PodNamespace": "ns", "PodUID": "s1",
                                           "Node": "s5k"}), 5)
    assert out == {"Error": ""} and kube.bound[-1][1] == "s1"  # answered with the Binding made
    snap = await ledger.snapshot("s5k")
    assert snap is not None and snap.reservations["s1"].state == "pending"  # not marked yet
    go.set()
    await ext.settled()
    snap = await ledger.snapshot("s5k")
    assert snap is not None and snap.reservations["s1"].state == "bound"
    assert not ext.confirms._settling


async def test_a_booking_that_cannot_be_marked_bound_is_counted_and_the_bind_stands(
        setup: tuple[Extender, FakeKube, Ledger], monkeypatch: pytest.MonkeyPatch) -> None:
    from redis.exceptions import ConnectionError as RedisConnectionError

    from shared.serving.metrics import SETTLE_FAILURES

    ext, _kube, ledger = setup

    async def unreachable(node_name: str, uids: list[str]) -> list[str]:
        raise RedisConnectionError("Redis went away")

    monkeypatch.setattr(ledger, "mark_bound_many", unreachable)
    before = SETTLE_FAILURES._value.get()
    p = pod("s2", {"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 32, "mthreads.com/sgpu-core": 4})
    ext.filter({"Pod": p, "NodeNames": ["s5k"], "Nodes": None})
    out = await ext.bind({"PodName": "p-s2", "PodNamespace": "ns", "PodUID": "s2", "Node": "s5k"})
    assert out == {"Error": ""}  # the Binding exists: saying otherwise would be false
    await ext.settled()
    assert SETTLE_FAILURES._value.get() == before + 1
    snap = await ledger.snapshot("s5k")
    assert snap is not None and snap.reservations["s2"].state == "pending"  # left to the watcher's observe
