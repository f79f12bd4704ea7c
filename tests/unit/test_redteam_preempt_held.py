"""Red team of the preempt verb: bookings in flight count, as in the filter.

The filter fits a node with the bookings in flight on it (`Extender.held`: binds under way, and the claim a
filter takes when it returns one node, since kube-scheduler schedules the next pod before that bind
arrives). The preempt verb judged the cards without them. Pod a was filtered to s4k (one node: its claim
holds 32 units of card 0, kube-scheduler assumed it there); the high-priority preemptor (96 units) then
fails every node and kube-scheduler proposes the low pod v (32 units of card 0; its totals count a, so v is
just enough). With v gone card 0 is empty in the mirror, so the verb kept v; but a takes 32 of its units,
and no card has the 96 the preemptor asks: v is evicted for nothing."""

from __future__ import annotations

from typing import Any

from controller.preempt import Preemption
from tests.unit._k8s import VGPU, ctr, pod
from tests.unit._servers import FakeKube, extender
from tests.unit.test_preempt import S4000, meta, preemptor, snapshot


def slice_pod(uid: str, memory: int) -> dict[str, Any]:
    p = pod(ctr("a", limits={VGPU: 1, "mthreads.com/sgpu-memory": memory, "mthreads.com/sgpu-core": 4}))
    p["metadata"].update(name=uid, namespace="ns", uid=uid)
    p["spec"]["schedulerName"] = "hami-scheduler"
    return p


async def test_a_booking_in_flight_counts_when_the_victims_are_judged() -> None:
    ext = extender(cfg=S4000, kube=FakeKube())
    ext.mirror.put(snapshot([("v", (0,), 32, 4, 1), ("o", (1,), 64, 4, 9999)]))
    # the filter returns s4k alone and claims card 0 (the emptier) for a
    assert ext.filter({"Pod": slice_pod("a", 32), "NodeNames": ["s4k"]})["NodeNames"] == ["s4k"]
    assert [cards for _, cards in ext.held["s4k"].values()] == [(0,)]
    out = await Preemption(ext).preempt({"Pod": preemptor(memory="96"), "NodeNameToMetaVictims": meta("s4k", "v")})
    assert out == {"NodeNameToMetaVictims": {}}, (
        f"answered {out}: with v gone and a's claimed 32 units on card 0, no card has 96 free")


async def test_a_node_whose_slot_moves_gets_no_eviction() -> None:
    # the filter calls it unresolvable (MOVING: Redis books nothing there until the move ends); an eviction
    # there now frees a card nobody can book, and the preemptor is nominated to a node it cannot bind to
    ext = extender(cfg=S4000, kube=FakeKube())
    ext.mirror.put(snapshot([("v", (0,), 64, 4, 1), ("o", (1,), 64, 4, 9999)]))
    ext.mirror.moving = frozenset({"s4k"})
    out = await Preemption(ext).preempt({"Pod": preemptor(memory="64"), "NodeNameToMetaVictims": meta("s4k", "v")})
    assert out == {"NodeNameToMetaVictims": {}}, out
