"""Red team on Extender._mark_bound (commit e24f59c): a bind whose booking went while it was in flight
books it again from the record it wrote. Attacks: the amounts it books must be what the pod watcher
decodes from that record (whole-card, multi-card, init-container and sidecar pods), else the watcher
calls the record "changed after our bind" and keeps the wrong booking for good; the watcher observing
first must not double it; a booking gone with its node must not be claimed as booked again.

Real parts: redis-server, the product's Ledger, Mirror, Extender and PodWatcher; the API server is the
recording stand-in of test_extender_bind (it writes nothing but what bind hands it)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from controller.extender import Extender
from controller.node_watch import NodeWatcher
from controller.pod_watch import PodWatcher
from shared.domain.annotations import usage_from_annotations
from shared.domain.node import node_inventory
from shared.serving.metrics import OVERCOMMIT, REBOOKED, RECORD_MISMATCH
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis.helpers import eventually
from tests.redis.test_extender_bind import CFG, FakeKube, node

pytestmark = pytest.mark.redis

VGPU, MEM, CORE = "mthreads.com/vgpu", "mthreads.com/sgpu-memory", "mthreads.com/sgpu-core"


class LosingKube(FakeKube):
    """Writes the Binding (and keeps the pod as the API server then has it); meanwhile the booking goes,
    as when the janitor expired it past the TTL. `also`: what else happens in that moment."""

    def __init__(self, ledger: Ledger, specs: Mapping[str, dict[str, Any]]) -> None:
        super().__init__()
        self.ledger = ledger
        self.specs = specs
        self.also: Any = None

    async def bind(self, ns: str, name: str, uid: str, node: str, annotations: Mapping[str, str],
                   until: float | None = None) -> None:
        assert await self.ledger.release(node, uid)
        await super().bind(ns, name, uid, node, annotations)
        self.pods[(ns, name)] = {
            "metadata": {"name": name, "namespace": ns, "uid": uid, "annotations": dict(annotations)},
            "spec": {**self.specs[uid], "nodeName": node}}
        if self.also is not None:
            await self.also(self.pods[(ns, name)])


def container(name: str, limits: Mapping[str, int], **extra: Any) -> dict[str, Any]:
    return {"name": name, "resources": {"limits": {k: str(v) for k, v in limits.items()}}, **extra}


SHAPES: dict[str, dict[str, Any]] = {
    "a slice": {"containers": [container("c", {VGPU: 1, MEM: 32, CORE: 8})]},
    "a whole card": {"containers": [container("c", {VGPU: 1})]},
    "two whole cards": {"containers": [container("c", {VGPU: 2})]},
    "an init container larger than the app": {
        "initContainers": [container("setup", {VGPU: 1, MEM: 64, CORE: 12})],
        "containers": [container("c", {VGPU: 1, MEM: 16, CORE: 4})]},
    "a sidecar beside the app": {
        "initContainers": [container("side", {VGPU: 1, MEM: 8, CORE: 2}, restartPolicy="Always")],
        "containers": [container("c", {VGPU: 1, MEM: 16, CORE: 4})]},
}


def spec(shape: str) -> dict[str, Any]:
    return {"schedulerName": "hami-scheduler", **SHAPES[shape]}


@pytest.fixture
async def parts(ledger: Ledger) -> AsyncIterator[tuple[Ledger, Mirror]]:
    for n in (node("s4k", 96, 2), node("s5k", 160, 2)):
        await ledger.upsert_node(node_inventory(n, CFG))
    mirror = Mirror(ledger)
    await mirror.start()
    await asyncio.wait_for(mirror.ready.wait(), 5)
    yield ledger, mirror
    await mirror.stop()


def as_filtered(uid: str, shape: str) -> dict[str, Any]:
    return {"metadata": {"name": f"p-{uid}", "namespace": "ns", "uid": uid, "annotations": {}}, "spec": spec(shape)}


async def bind(ext: Extender, uid: str, shape: str, node_name: str) -> dict[str, Any]:
    ext.filter({"Pod": as_filtered(uid, shape), "NodeNames": [node_name], "Nodes": None})
    out = await ext.bind({"PodName": f"p-{uid}", "PodNamespace": "ns", "PodUID": uid, "Node": node_name})
    await ext.settled()  # bind answers once the Binding exists; the booking is marked bound after
    return out


@pytest.mark.parametrize("node_name", ["s4k", "s5k"])
@pytest.mark.parametrize("shape", list(SHAPES))
async def test_the_rebooking_is_what_the_watcher_reads_from_the_record(parts: tuple[Ledger, Mirror], shape: str,
                                                                       node_name: str) -> None:
    ledger, mirror = parts
    uid = "r-" + shape.replace(" ", "-")
    kube = LosingKube(ledger, {uid: spec(shape)})
    ext = Extender(CFG, ledger, mirror, kube)  # type: ignore[arg-type]
    before = REBOOKED._value.get()
    assert await bind(ext, uid, shape, node_name) == {"Error": ""}
    assert REBOOKED._value.get() == before + 1  # the attack ran: the booking was gone at mark_bound
    bound_pod = kube.pods[("ns", f"p-{uid}")]
    want = usage_from_annotations(bound_pod)
    assert want is not None
    snap = await ledger.snapshot(node_name)
    assert snap is not None
    r = snap.reservations[uid]
    assert r.state == "bound"
    assert (r.cards, r.mem, r.cores, r.slices) == (want.cards, want.memory, want.cores, want.slices)
    # the watcher, seeing the record, finds nothing to change and no record "changed after our bind"
    watcher = PodWatcher(kube, ledger, mirror, CFG, asyncio.Event())  # type: ignore[arg-type]
    changed = RECORD_MISMATCH.labels("changed")._value.get()
    out = await ledger.observe(uid, want, f"ns/p-{uid}", keep_bound=True)
    assert out == {"ok": True, "changed": False, "overcommit": False}
    await watcher.record(uid, bound_pod)
    assert RECORD_MISMATCH.labels("changed")._value.get() == changed
    assert watcher.seen.get(uid) is not None and not watcher.lost.is_set()
    # once: the cards hold exactly this booking
    after = await ledger.snapshot(node_name)
    assert after is not None
    for i in want.cards:
        assert (after.cards[i].mem_used, after.cards[i].cores_used, after.cards[i].slices) == (
            want.memory, want.cores, want.slices)


async def test_the_watcher_observing_first_is_not_booked_twice(parts: tuple[Ledger, Mirror]) -> None:
    """The pod watcher sees the record (and books it) before the binder's mark_bound: the binder finds
    the booking there and leaves it; the card holds it once."""
    ledger, mirror = parts
    uid = "first"
    kube = LosingKube(ledger, {uid: spec("a slice")})
    watcher = PodWatcher(kube, ledger, mirror, CFG, asyncio.Event())  # type: ignore[arg-type]
    watcher.bound_grace = 0  # observe at once, not after waiting for the binder's confirmation

    async def watcher_sees(pod: dict[str, Any]) -> None:
        watcher.learn(uid, pod)
        await watcher.record(uid, pod)

    kube.also = watcher_sees
    ext = Extender(CFG, ledger, mirror, kube)  # type: ignore[arg-type]
    before = REBOOKED._value.get()
    assert await bind(ext, uid, "a slice", "s4k") == {"Error": ""}
    assert REBOOKED._value.get() == before  # nothing went missing by the time the binder looked
    snap = await ledger.snapshot("s4k")
    assert snap is not None
    assert sum(c.mem_used for c in snap.cards.values()) == 32 and sum(c.slices for c in snap.cards.values()) == 1
    assert snap.reservations[uid].state == "bound"


async def test_a_booking_gone_with_its_node_is_not_claimed_as_booked_again(parts: tuple[Ledger, Mirror],
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    """The node's keys went while the bind was in flight (its Node was deleted, the pending booking
    expired past the TTL, and the node, nothing settling any more, was forgotten). `observe` refuses a
    node the ledger lacks, so nothing is booked: neither the counter ("booked again from the record")
    nor the log line may claim it was."""
    ledger, mirror = parts
    uid = "gone"
    kube = LosingKube(ledger, {uid: spec("a slice")})

    async def node_forgotten(_pod: dict[str, Any]) -> None:
        assert await ledger.remove_node("s4k", keep_ms=10_000) is True

    kube.also = node_forgotten
    ext = Extender(CFG, ledger, mirror, kube)  # type: ignore[arg-type]
    before = REBOOKED._value.get()
    assert await bind(ext, uid, "a slice", "s4k") == {"Error": ""}
    assert await ledger.snapshot("s4k") is None  # nothing booked, the node stays forgotten
    assert REBOOKED._value.get() == before
    said = [r.getMessage() for r in caplog.records if "ns/p-gone" in r.getMessage()]
    assert said and not any("booked again" in m for m in said) and any("nothing is booked" in m for m in said)


async def test_a_rebooking_that_over_commits_is_counted_as_over_commit(parts: tuple[Ledger, Mirror]) -> None:
    """The booking expired while the bind was slow, and another pod took the share meanwhile: the rebook
    over-commits the card. The watcher, seeing the record later, finds the booking as it is and reports
    nothing; so MtschedOvercommitObserved fires only if the rebook counts it."""
    ledger, mirror = parts
    uid = "slow"
    kube = LosingKube(ledger, {uid: spec("an init container larger than the app")})

    async def share_taken(pod: dict[str, Any]) -> None:
        usage = usage_from_annotations(pod)
        assert usage is not None
        out, _ = await ledger.reserve("s4k", "other", list(usage.cards), 64, 8, 1, pod="ns/other")
        assert out.ok

    kube.also = share_taken
    ext = Extender(CFG, ledger, mirror, kube)  # type: ignore[arg-type]
    before = OVERCOMMIT._value.get()
    assert await bind(ext, uid, "an init container larger than the app", "s4k") == {"Error": ""}
    snap = await ledger.snapshot("s4k")
    assert snap is not None and {"slow", "other"} <= set(snap.reservations)
    assert any(c.mem_used > c.capacity for c in snap.cards.values())  # the attack ran: over-committed
    assert OVERCOMMIT._value.get() == before + 1
    # the watcher's view of the record adds nothing (no second count, no mismatch)
    watcher = PodWatcher(kube, ledger, mirror, CFG, asyncio.Event())  # type: ignore[arg-type]
    await watcher.record(uid, kube.pods[("ns", f"p-{uid}")])
    assert OVERCOMMIT._value.get() == before + 1


async def test_a_pod_deleted_meanwhile_is_not_booked_again(parts: tuple[Ledger, Mirror]) -> None:
    """The pod is deleted in the moment between its Binding and the confirmation: the pod watcher's release
    ran first (it released nothing). The bind finds the pod gone from the API server (404) and books
    nothing; the cards stay free, with nothing for the reconciler to heal. (Before, the rebook booked a pod
    nobody would release, until the reconciler dropped it.)"""
    ledger, mirror = parts
    uid = "deleted"
    kube = LosingKube(ledger, {uid: spec("a slice")})
    nodes = NodeWatcher(kube, ledger, CFG, keep_ms=0)  # type: ignore[arg-type]
    pods = PodWatcher(kube, ledger, mirror, CFG, nodes.lost)  # type: ignore[arg-type]

    async def deleted(pod: dict[str, Any]) -> None:
        del kube.pods[("ns", pod["metadata"]["name"])]
        await pods.on_event("DELETED", pod)

    kube.also = deleted
    ext = Extender(CFG, ledger, mirror, kube)  # type: ignore[arg-type]
    before = REBOOKED._value.get()
    assert await bind(ext, uid, "a slice", "s4k") == {"Error": ""}
    snap = await ledger.snapshot("s4k")
    assert snap is not None and uid not in snap.reservations
    assert all(c.mem_used == 0 for c in snap.cards.values())
    assert REBOOKED._value.get() == before
    await eventually(lambda: (m := mirror.get("s4k")) is not None and uid not in m.reservations,
                     what="the mirror shows the share free")
