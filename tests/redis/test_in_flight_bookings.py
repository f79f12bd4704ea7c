"""Bookings in flight survive a node that goes away and comes back (real redis-server).

Between the reserve script and the Binding a bind takes a moment; a booking made or bound a moment ago
may not be in the watchers' view yet. Its binder writes the Binding and its record whatever the ledger
says meanwhile, so a ledger that forgets such a booking offers a share a pod is about to hold: the CI run
of 2026-12-01 ended with a card at 17/16 cores after a node was deleted and re-created under a burst.
These pin the rule (shared/store/lua/_lib.lua `settles`, shared/domain/reconcile.py `settles`): a
settling booking is kept through deletion, capacity 0 and re-creation, and a bind whose booking went
anyway books it again from the record it wrote.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest
from redis.asyncio import Redis

from controller.extender import Extender
from controller.node_watch import NodeWatcher
from shared.config import Config, load_config
from shared.domain.annotations import PodUsage
from shared.serving.metrics import REBOOKED
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis.test_extender_bind import FakeKube, pod

pytestmark = pytest.mark.redis
CFG = load_config(env={}, flags={"memoryPerCard": "96,160"})


class _Kube:
    """The node watcher's API client: none of these tests expects a call."""

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        raise AssertionError(f"unexpected {method} {path}")


def s4000_node(name: str, cards: int = 2) -> dict[str, Any]:
    cap = {"mthreads.com/sgpu-core": str(16 * cards), "mthreads.com/sgpu-memory": str(96 * cards)}
    return {"metadata": {"name": name}, "status": {"capacity": cap, "allocatable": cap}}


def watcher(ledger: Ledger, holders: Mapping[str, tuple[PodUsage, str]] | None = None,
            keep_ms: int = 10_000) -> NodeWatcher:
    w = NodeWatcher(_Kube(), ledger, Config(), keep_ms=keep_ms)  # type: ignore[arg-type]
    w.holders = lambda node: dict(holders or {})
    return w


async def used(ledger: Ledger, node: str) -> dict[int, tuple[int, int, int]]:
    s = (await ledger.snapshots([node])).get(node)
    return {} if s is None else {i: (c.mem_used, c.cores_used, c.slices) for i, c in s.cards.items()}


@pytest.mark.parametrize("fault", ["deleted", "capacity 0"])
@pytest.mark.parametrize("with_holder", [False, True], ids=["no holder", "a bound holder"])
async def test_a_pending_booking_survives_the_node_going_and_coming_back(ledger: Ledger, fault: str,
                                                                         with_holder: bool) -> None:
    node = s4000_node("gx")
    holder = {"b1": (PodUsage("gx", (1,), 8, 2, 1), "ns/b1")} if with_holder else {}
    w = watcher(ledger, holder)
    await w.on_event("ADDED", node)
    if with_holder:
        assert (await ledger.reserve("gx", "b1", [1], 8, 2, 1, pod="ns/b1"))[0].ok
        assert await ledger.mark_bound("gx", "b1")
    # a bind in flight: booked, not bound yet, in nobody's view
    assert (await ledger.reserve("gx", "p1", [0], 64, 12, 1, pod="ns/p1"))[0].ok
    if fault == "deleted":
        await w.on_event("DELETED", node)
    else:
        await w.on_event("MODIFIED", {**node, "status": {"capacity": {"mthreads.com/sgpu-core": "0",
                                                                       "mthreads.com/sgpu-memory": "0"}}})
    gone = (await ledger.snapshots(["gx"]))["gx"]
    assert "p1" in gone.reservations and gone.card_states() == []  # kept, and offers nothing
    assert (await used(ledger, "gx"))[0] == (64, 12, 1)
    await w.on_event("ADDED", node)  # back, as it was
    assert (await used(ledger, "gx"))[0] == (64, 12, 1)
    # the share the bind in flight holds is not offered again ...
    second, _ = await ledger.reserve("gx", "p2", [0], 64, 12, 1, pod="ns/p2")
    assert not second.ok and second.reason == "CardInsufficientMemory"
    # ... what is left is, and the bind in flight completes
    assert (await ledger.reserve("gx", "p3", [0], 32, 4, 1, pod="ns/p3"))[0].ok
    assert await ledger.mark_bound("gx", "p1")
    assert (await used(ledger, "gx"))[0] == (96, 16, 2)
    if with_holder:
        assert (await used(ledger, "gx"))[1] == (8, 2, 1)


async def test_a_just_bound_booking_not_yet_seen_survives_deletion(ledger: Ledger) -> None:
    """Bound a moment ago (inside the keep window), its record not yet in the pod watcher's view."""
    w = watcher(ledger)
    await w.on_event("ADDED", s4000_node("gy"))
    assert (await ledger.reserve("gy", "p1", [0], 32, 8, 1, pod="ns/p1"))[0].ok
    assert await ledger.mark_bound("gy", "p1")
    await w.on_event("DELETED", s4000_node("gy"))
    await w.on_event("ADDED", s4000_node("gy"))
    assert (await used(ledger, "gy"))[0] == (32, 8, 1)


async def _redis_clock_passes(ledger: Ledger, stamp: int) -> None:
    for _ in range(200):
        if await ledger.redis_time_ms() > stamp:
            return
        await asyncio.sleep(0.005)
    raise AssertionError("Redis's clock did not move")


async def test_a_node_with_nothing_settling_is_forgotten(ledger: Ledger) -> None:
    """A bound booking older than the keep window that no live pod explains is stale: the deleted node
    goes whole, and comes back empty."""
    w = watcher(ledger, keep_ms=0)
    await w.on_event("ADDED", s4000_node("gz"))
    assert (await ledger.reserve("gz", "old", [0], 32, 8, 1, pod="ns/old"))[0].ok
    assert await ledger.mark_bound("gz", "old")
    bound_at = (await ledger.snapshots(["gz"]))["gz"].reservations["old"].bound_at
    await _redis_clock_passes(ledger, bound_at)
    await w.on_event("DELETED", s4000_node("gz"))
    assert "gz" not in await ledger.nodes() and (await ledger.snapshots(["gz"])).get("gz") is None
    await w.on_event("ADDED", s4000_node("gz"))
    assert (await used(ledger, "gz")) == {0: (0, 0, 0), 1: (0, 0, 0)}


async def test_remove_node_leaves_a_node_where_a_booking_settles(ledger: Ledger) -> None:
    w = watcher(ledger)
    await w.on_event("ADDED", s4000_node("gw"))
    assert (await ledger.reserve("gw", "p1", [1], 2, 1, 1))[0].ok
    assert await ledger.remove_node("gw", keep_ms=10_000) is None
    assert "p1" in (await ledger.snapshots(["gw"]))["gw"].reservations
    assert await ledger.remove_node("gw") is True  # without keep_ms: forgotten whatever settles
    assert await ledger.remove_node("gw", keep_ms=10_000) is False


class _LosingKube(FakeKube):
    """Writes the Binding, and meanwhile the booking goes (as when it expired past the TTL)."""

    def __init__(self, ledger: Ledger) -> None:
        super().__init__()
        self.ledger = ledger

    async def bind(self, ns: str, name: str, uid: str, node: str, annotations: Mapping[str, str],
                   until: float | None = None) -> None:
        assert await self.ledger.release(node, uid)
        await super().bind(ns, name, uid, node, annotations)
        # the pod as the API server then has it: still there, so its booking is made again
        self.pods[(ns, name)] = {"metadata": {"name": name, "namespace": ns, "uid": uid,
                                              "annotations": dict(annotations)}, "spec": {"nodeName": node}}


async def test_a_bind_whose_booking_went_in_flight_books_it_again(redis_client: Redis, ledger: Ledger) -> None:
    from shared.domain.node import node_inventory

    await ledger.upsert_node(node_inventory(s4000_node("gb"), CFG))
    mirror = Mirror(ledger)
    await mirror.start()
    try:
        await asyncio.wait_for(mirror.ready.wait(), 5)
        kube = _LosingKube(ledger)
        ext = Extender(CFG, ledger, mirror, kube)  # type: ignore[arg-type]
        p = pod("r1", {"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 32, "mthreads.com/sgpu-core": 8})
        ext.filter({"Pod": p, "NodeNames": ["gb"], "Nodes": None})
        before = REBOOKED._value.get()
        out = await ext.bind({"PodName": "p-r1", "PodNamespace": "ns", "PodUID": "r1", "Node": "gb"})
        await ext.settled()  # marked bound after the answer
        assert out == {"Error": ""} and len(kube.bound) == 1
        snap = await ledger.snapshot("gb")
        assert snap is not None and snap.reservations["r1"].state == "bound"
        r = snap.reservations["r1"]
        assert (r.mem, r.cores, r.slices, r.pod) == (32, 8, 1, "ns/p-r1")
        assert sum(c.mem_used for c in snap.cards.values()) == 32
        assert REBOOKED._value.get() == before + 1
    finally:
        await mirror.stop()
