"""Red team on Confirmations.settle, controller/confirm.py (bind answers once the Binding exists, mark_bound runs
after, in a background task), and the fix: a booking found gone is booked again only while the pod is still there.

Attack: the pod is deleted right after the bind was answered and the pod watcher releases its booking
(DELETED -> PodWatcher.release) before the background mark_bound has reached Redis. mark_bound finds
no reservation, and _mark_bound's fallback books it again from the record (observe keep_bound), as
`bound`: a share held for a pod that no longer exists. The watcher released it once and never again;
only the reconciler drops it (after the keep window, at its next pass).

The same fallback existed before the commit (a release landing while kube.bind was in flight, see
test_the_same_rebook_happened_before_the_answer_too); the commit moves the end of the window from
"before bind answers" to "whenever the settle task's EVALSHA reaches Redis" (one more pass of the
event loop, longer under a CPU-bound filter burst).

Real parts: redis-server, the product's Ledger, Mirror, Extender and PodWatcher; the API server is the
recording stand-in of test_extender_bind."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from controller.extender import Extender
from controller.pod_watch import PodWatcher
from shared.domain.node import node_inventory
from shared.serving.metrics import REBOOKED
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis.helpers import hold_confirmations
from tests.redis.test_extender_bind import CFG, FakeKube, node, pod

pytestmark = pytest.mark.redis

SLICE = {"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 32, "mthreads.com/sgpu-core": 4}


class KeepingKube(FakeKube):
    """Writes the Binding and keeps the pod as the API server then has it (for the watcher's DELETED)."""

    def __init__(self) -> None:
        super().__init__()
        self.during: Any = None  # called with the bound pod, before bind returns

    async def bind(self, ns: str, name: str, uid: str, node: str, annotations: Mapping[str, str],
                   until: float | None = None) -> None:
        await super().bind(ns, name, uid, node, annotations)
        p = pod(uid, SLICE)
        p["metadata"]["annotations"] = dict(annotations)
        p["spec"]["nodeName"] = node
        self.pods[(ns, name)] = p
        if self.during is not None:
            await self.during(p)


def held_confirmation(ledger: Ledger, kube: KeepingKube, mirror: Mirror,
                      monkeypatch: pytest.MonkeyPatch) -> tuple[Extender, PodWatcher, asyncio.Event]:
    """The extender and the pod watcher, with the bind's confirmation (mark_bound) held until the event is set:
    the settle task, behind the loop's other work."""
    go = hold_confirmations(ledger, monkeypatch)
    ext = Extender(CFG, ledger, mirror, kube)  # type: ignore[arg-type]
    return ext, PodWatcher(kube, ledger, mirror, CFG, asyncio.Event()), go  # type: ignore[arg-type]


@pytest.fixture
async def parts(ledger: Ledger) -> AsyncIterator[tuple[Ledger, Mirror]]:
    await ledger.upsert_node(node_inventory(node("s5k", 160, 2), CFG))
    mirror = Mirror(ledger)
    await mirror.start()
    await asyncio.wait_for(mirror.ready.wait(), 5)
    yield ledger, mirror
    await mirror.stop()


async def test_a_pod_deleted_and_released_after_the_answer_is_not_booked_again(
        parts: tuple[Ledger, Mirror], monkeypatch: pytest.MonkeyPatch) -> None:
    ledger, mirror = parts
    kube = KeepingKube()
    ext, watcher, go = held_confirmation(ledger, kube, mirror, monkeypatch)
    ext.filter({"Pod": pod("d1", SLICE), "NodeNames": ["s5k"], "Nodes": None})
    before = REBOOKED._value.get()
    out = await asyncio.wait_for(ext.bind({"PodName": "p-d1", "PodNamespace": "ns", "PodUID": "d1",
                                           "Node": "s5k"}), 5)  # (the parent commit never answers here)
    assert out == {"Error": ""}
    # the pod is deleted at once; the pod watcher sees DELETED and releases it (once)
    bound_pod = kube.pods.pop(("ns", "p-d1"))
    await watcher.on_event("DELETED", bound_pod)
    snap = await ledger.snapshot("s5k")
    assert snap is not None and "d1" not in snap.reservations  # released: the cards are free
    go.set()
    await ext.settled()
    snap = await ledger.snapshot("s5k")
    assert snap is not None
    # failed on 0f4b722: the background mark_bound's fallback booked the deleted pod again, `bound`
    assert "d1" not in snap.reservations, (
        f"a deleted, released pod was booked again by the settle task: {snap.reservations.get('d1')} "
        f"(REBOOKED +{REBOOKED._value.get() - before}); cards used {[c.mem_used for c in snap.cards.values()]}")


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
async def test_a_pod_that_ended_and_was_released_after_the_answer_is_not_booked_again(
        parts: tuple[Ledger, Mirror], monkeypatch: pytest.MonkeyPatch, phase: str) -> None:
    """The same race with a pod that ends (its phase Succeeded or Failed) instead of being deleted: it still exists,
    bound here, so the confirmation's check that it was "still here" passed and its booking was made again for
    good, for a pod that holds nothing (a clean-clone CI run: test_deleted_and_completed_pods_release_their_share,
    the pod set Succeeded within the confirmation's linger)."""
    ledger, mirror = parts
    kube = KeepingKube()
    ext, watcher, go = held_confirmation(ledger, kube, mirror, monkeypatch)
    ext.filter({"Pod": pod("e1", SLICE), "NodeNames": ["s5k"], "Nodes": None})
    out = await asyncio.wait_for(ext.bind({"PodName": "p-e1", "PodNamespace": "ns", "PodUID": "e1",
                                           "Node": "s5k"}), 5)
    assert out == {"Error": ""}
    ended = kube.pods[("ns", "p-e1")]
    ended["status"] = {"phase": phase}  # the pod ends at once, still there; the watcher releases it
    await watcher.on_event("MODIFIED", ended)
    snap = await ledger.snapshot("s5k")
    assert snap is not None and "e1" not in snap.reservations
    go.set()
    await ext.settled()
    snap = await ledger.snapshot("s5k")
    assert snap is not None and "e1" not in snap.reservations, snap.reservations.get("e1")


async def test_a_release_right_after_the_answer_stands(parts: tuple[Ledger, Mirror]) -> None:
    """No artificial delay: the release is sent the moment bind has answered (in-process, before the
    loop runs the settle task). It failed every time on 0f4b722."""
    ledger, mirror = parts
    kube = KeepingKube()
    ext = Extender(CFG, ledger, mirror, kube)  # type: ignore[arg-type]
    watcher = PodWatcher(kube, ledger, mirror, CFG, asyncio.Event())  # type: ignore[arg-type]
    ext.filter({"Pod": pod("d3", SLICE), "NodeNames": ["s5k"], "Nodes": None})
    out = await ext.bind({"PodName": "p-d3", "PodNamespace": "ns", "PodUID": "d3", "Node": "s5k"})
    assert out == {"Error": ""}
    await watcher.on_event("DELETED", kube.pods.pop(("ns", "p-d3")))
    await ext.settled()
    snap = await ledger.snapshot("s5k")
    assert snap is not None and "d3" not in snap.reservations, snap.reservations.get("d3")


async def test_a_pod_deleted_while_its_binding_was_written_is_not_booked_again(parts: tuple[Ledger, Mirror]) -> None:
    """The same race before the answer (it predates _settle): the pod deleted and released while the
    Binding's response is on its way. Gone from the API server, it is not booked again."""
    ledger, mirror = parts
    kube = KeepingKube()
    ext = Extender(CFG, ledger, mirror, kube)  # type: ignore[arg-type]
    watcher = PodWatcher(kube, ledger, mirror, CFG, asyncio.Event())  # type: ignore[arg-type]

    async def deleted_meanwhile(p: dict[str, Any]) -> None:
        kube.pods.pop(("ns", "p-d2"))
        await watcher.on_event("DELETED", p)

    kube.during = deleted_meanwhile
    ext.filter({"Pod": pod("d2", SLICE), "NodeNames": ["s5k"], "Nodes": None})
    before = REBOOKED._value.get()
    out = await ext.bind({"PodName": "p-d2", "PodNamespace": "ns", "PodUID": "d2", "Node": "s5k"})
    await ext.settled()
    assert out == {"Error": ""}
    snap = await ledger.snapshot("s5k")
    assert snap is not None and "d2" not in snap.reservations, snap.reservations.get("d2")
    assert REBOOKED._value.get() == before
