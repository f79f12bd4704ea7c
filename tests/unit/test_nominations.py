"""Pods nominated by a preemption keep the cards they fit on a node from pods of lower or equal priority: in the
preempt verb (the next preemptor's victims must leave it a card besides the nominated pod's) and in filter and
bind (a lower-priority pod does not take the card freed for it). kube-scheduler's own filters do the same with the
node's totals. The red team's case on the real control plane: tests/e2e/test_redteam_preempt_nominated.py."""

from __future__ import annotations

from typing import Any

import pytest

from controller.nominations import MAX_NOMINATIONS, NOMINATION_SECONDS, Nominations
from controller.preempt import Preemption
from shared.domain.preempt import KEPT, NO_CARD, UNCHANGED, Ahead, choose_victims, plan_ahead, pod_priority
from tests.unit._servers import FakeKube, bind_args, extender
from tests.unit.test_plan import admitted, bind_setup
from tests.unit.test_preempt import S4000, meta, node, preemptor, sl, snapshot, whole


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def ahead(uid: str, priority: int, memory: int | None = None, victims: tuple[str, ...] = ()) -> Ahead:
    return Ahead(uid, priority, sl(memory) if memory is not None else whole(), {}, victims)


# -- the pure rule ---------------------------------------------------------------------------------------------

# v1 holds card 0 whole; y (top) and l (lowest) 32 units each of card 1; p1 (64 units) was nominated after
# preempting l. p2 (a whole card) proposes v1 and l: with both gone card 0 is idle, but p1 takes it first
RED_TEAM = [("v1", (0,), 96, 16, 100), ("y", (1,), 32, 4, 9999), ("l", (1,), 32, 4, 1)]

CASES: list[tuple[str, list[Any], list[str], Any, list[Ahead], str]] = [
    # name, pods on the node, kube-scheduler's victims, preemptor, nominated ahead of it, outcome
    ("no nomination: the idle card is the preemptor's", RED_TEAM, ["v1", "l"], whole(), [], KEPT),
    ("the nominated pod takes the card first", RED_TEAM, ["v1", "l"], whole(), [ahead("p1", 1000, 64)], NO_CARD),
    ("room for both: the proposal stands", [("v1", (0,), 64, 4, 1), ("l", (1,), 64, 4, 1)], ["v1", "l"], sl(64),
     [ahead("p1", 1000, 64)], KEPT),
    ("a nominated pod that fits nowhere even then keeps no card",
     [("v1", (0,), 32, 4, 1), ("x", (0,), 32, 4, 9999), ("w", (1,), 96, 16, 9999)], ["v1"], sl(64),
     [ahead("p1", 1000)], KEPT),
    ("fits already beside the nominated pod", [("y", (1,), 32, 4, 9999)], ["y"], sl(32), [ahead("p1", 1000, 64)],
     UNCHANGED),
    ("the nominated pod leaves no card as things are", [("y", (1,), 48, 4, 9999)], ["y"], sl(64),
     [ahead("p1", 1000, 64)], KEPT),
    # p1's own victim w still holds card 1 (terminating): p1 goes there once it is gone, card 0 is the preemptor's
    ("the nominated pod's victims free its card", [("v", (0,), 64, 4, 1), ("w", (1,), 64, 4, 1)], ["v"], sl(64),
     [ahead("p1", 1000, 64, victims=("w",))], KEPT),
    ("without its victims known it would take the preemptor's card", [("v", (0,), 64, 4, 1), ("w", (1,), 64, 4, 1)],
     ["v"], sl(64), [ahead("p1", 1000, 64)], NO_CARD),
    ("a victim of both counted once", [("v", (0,), 64, 4, 1), ("w", (1,), 64, 4, 1)], ["v", "w"], whole(2),
     [ahead("p1", 1000, 64, victims=("w",))], NO_CARD),
]


@pytest.mark.parametrize(("held", "proposed", "req", "first", "outcome"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_victims_leave_the_nominated_pods_their_cards(held: list[Any], proposed: list[str], req: Any,
                                                      first: list[Ahead], outcome: str) -> None:
    states, holdings = node(held)
    assert choose_victims(states, holdings, proposed, req, {}, "spread", first).outcome == outcome


def test_plan_ahead_highest_priority_first_and_skips_what_does_not_fit() -> None:
    states, _ = node([("y", (1,), 32, 4, 1)])
    # card 0 idle (96), card 1 has 64 free: the top pod (whole card) gets card 0, the next (64) card 1, the
    # last (64) fits nowhere then and keeps nothing
    after, planned = plan_ahead(states, {}, [ahead("c", 5, 64), ahead("a", 9), ahead("b", 7, 64)])
    assert planned == {"a": (0,), "b": (1,)}
    assert [s.memory_used for s in after] == [96, 96]
    # the same pods given in another order plan alike
    assert plan_ahead(states, {}, [ahead("b", 7, 64), ahead("a", 9), ahead("c", 5, 64)])[1] == planned


def test_plan_ahead_places_a_pod_where_its_victims_go_over_them_meanwhile() -> None:
    states, holdings = node([("w", (1,), 64, 4, 1), ("v", (0,), 32, 4, 1)])
    after, planned = plan_ahead(states, holdings, [ahead("p1", 9, 64, victims=("w",))])
    # card 1 is p1's once w is gone; until then it is over-full, so nothing else fits there
    assert planned == {"p1": (1,)} and [s.memory_used for s in after] == [32, 128]


@pytest.mark.parametrize(("spec", "priority"), [
    ({"priority": 1000}, 1000), ({"priority": -5}, -5), ({}, 0), ({"priority": True}, 0), ({"priority": "9"}, 0),
    (None, 0),
])
def test_pod_priority(spec: Any, priority: int) -> None:
    assert pod_priority({"spec": spec}) == priority


# -- the memory of nominations -----------------------------------------------------------------------------------

def test_ahead_of_counts_other_pods_of_a_priority_at_least_its_own_not_booked_yet() -> None:
    n = Nominations(Clock())
    n.record("p1", 1000, sl(64), {}, ["a", "b"])
    n.record("p0", 10, sl(32), {}, ["a"])
    assert [x.uid for x in n.ahead_of("a", "q", 500)] == ["p1"]
    assert sorted(x.uid for x in n.ahead_of("a", "q", 10)) == ["p0", "p1"]  # equal priority counts
    assert n.ahead_of("a", "q", 1001) == []
    assert n.ahead_of("a", "p1", 0) == [x for x in n.ahead_of("a", "p1", 0) if x.uid != "p1"]  # never itself
    assert n.ahead_of("a", "q", 500, booked={"p1": object()}) == []  # booked there: its reservation counts
    assert n.ahead_of("c", "q", 0) == []


def test_a_nomination_narrows_moves_and_lapses() -> None:
    clock = Clock()
    n = Nominations(clock)
    assert n.record("p1", 1000, sl(64), {}, ["a", "b", "c"]) == set()
    assert n.record("p1", 1000, sl(64), {}, ["b"]) == {"a", "c"}  # kube-scheduler chose b: a and c are left
    assert set(n.by_node) == {"b"}
    clock.now += NOMINATION_SECONDS - 1
    n.record("p2", 5, sl(32), {}, ["c"])
    clock.now += 2  # p1 not seen for NOMINATION_SECONDS + 1
    assert n.ahead_of("b", "q", 0) == []  # lapsed, even before lapse() runs
    assert n.lapse() == {"b"}
    assert set(n.by_uid) == {"p2"} and set(n.by_node) == {"c"}
    assert n.forget("p2") == {"c"} and not n and n.by_node == {}
    assert n.forget("p2") == set()


def test_bounded() -> None:
    n = Nominations(Clock())
    for i in range(MAX_NOMINATIONS + 10):
        n.record(f"p{i}", 1, sl(32), {}, [f"n{i % 7}"])
    assert len(n.by_uid) == MAX_NOMINATIONS and "p0" not in n.by_uid and f"p{MAX_NOMINATIONS + 9}" in n.by_uid
    assert sum(len(u) for u in n.by_node.values()) == MAX_NOMINATIONS


# -- the extender: preempt verb, then filter and bind ------------------------------------------------------------

def slice_pod(uid: str, memory: int, priority: int, nominated: str = "") -> dict[str, Any]:
    p = preemptor(uid, memory=str(memory))
    p["spec"]["priority"] = priority
    if nominated:
        p["status"] = {"nominatedNodeName": nominated}
    return p


def two_cards(uid: str, priority: int) -> dict[str, Any]:
    p = slice_pod(uid, 64, priority)
    p["spec"]["containers"] = [{"name": "c", "resources": {"limits": {"mthreads.com/vgpu": "2"}}}]
    return p


async def test_the_verb_records_its_preemptor_and_the_next_preemptor_leaves_it_the_card() -> None:
    ext = extender(cfg=S4000, kube=FakeKube())
    # card 0: v (64, low); card 1: w (64, low). p1 (64) proposes w; its nomination remembers w as its victim
    ext.mirror.put(snapshot([("v", (0,), 64, 4, 1), ("w", (1,), 64, 4, 1)]))
    verb = Preemption(ext)
    out = await verb.preempt({"Pod": slice_pod("p1", 64, 1000), "NodeNameToMetaVictims": meta("s4k", "w")})
    assert out["NodeNameToMetaVictims"], out
    assert [(x.uid, x.at("s4k").victims) for x in ext.nominations.ahead_of("s4k", "p2", 500)] == [("p1", ("w",))]
    # w terminating: p2 (64, lower) proposes v; p1 will have card 1, v's card 0 is p2's
    out = await verb.preempt({"Pod": slice_pod("p2", 64, 500), "NodeNameToMetaVictims": meta("s4k", "v")})
    assert out["NodeNameToMetaVictims"], out
    # p3 (two cards, lower) proposes v and w: p1 keeps one of them, nothing is evicted for p3
    out = await verb.preempt({"Pod": two_cards("p3", 500), "NodeNameToMetaVictims": meta("s4k", "v", "w")})
    assert out == {"NodeNameToMetaVictims": {}}, out
    # a pod above p1 does not count it
    out = await verb.preempt({"Pod": two_cards("p4", 2000), "NodeNameToMetaVictims": meta("s4k", "v", "w")})
    assert out["NodeNameToMetaVictims"], out


async def test_filter_and_bind_leave_a_nominated_pod_its_card() -> None:
    ext = extender(cfg=S4000, kube=FakeKube())
    ext.mirror.put(snapshot([("y", (1,), 32, 4, 9999)]))  # card 0 idle (freed for p1), card 1 has 64 free
    ext.nominate("p1", 1000, sl(96), {}, ["s4k"])
    low = slice_pod("q", 96, 10)
    got = ext.filter({"Pod": low, "NodeNames": ["s4k"]})
    assert got["NodeNames"] == [] and "s4k" in got["FailedNodes"], got  # card 0 is p1's
    # one of 64 fits beside it (card 1), whatever the policy would prefer
    assert ext.filter({"Pod": slice_pod("r", 64, 10), "NodeNames": ["s4k"]})["NodeNames"] == ["s4k"]
    assert [cards for _, cards in ext.held["s4k"].values()] == [(1,)]  # r's claim: card 1, not p1's card 0
    # p1 itself, filtered with its nomination, is not held back by it (r's claim is on card 1)
    assert ext.filter({"Pod": slice_pod("p1", 96, 1000, nominated="s4k"), "NodeNames": ["s4k"]})["NodeNames"] \
        == ["s4k"]
    # nor a pod above it
    ext = extender(cfg=S4000, kube=FakeKube())
    ext.mirror.put(snapshot([("y", (1,), 32, 4, 9999)]))
    ext.nominate("p1", 1000, sl(96), {}, ["s4k"])
    assert ext.filter({"Pod": slice_pod("top", 96, 5000), "NodeNames": ["s4k"]})["NodeNames"] == ["s4k"]


async def test_a_pod_turned_away_for_a_nomination_is_woken_when_it_moves() -> None:
    ext = extender(cfg=S4000, kube=FakeKube())
    ext.mirror.put(snapshot([("y", (1,), 32, 4, 9999)]))
    ext.nominate("p1", 1000, sl(96), {}, ["s4k", "other"])
    assert ext.filter({"Pod": slice_pod("q", 96, 10), "NodeNames": ["s4k"]})["NodeNames"] == []
    woken: list[str] = []
    ext._wake = woken.append  # type: ignore[method-assign]
    # kube-scheduler nominated p1 to another node: s4k's card is free for q again
    ext.filter({"Pod": slice_pod("p1", 96, 1000, nominated="other"), "NodeNames": ["other"]})
    assert woken == ["s4k"]
    assert ext.filter({"Pod": slice_pod("q", 96, 10), "NodeNames": ["s4k"]})["NodeNames"] == ["s4k"]


async def test_bind_plans_around_a_nominated_pod() -> None:
    # where u1 goes on an idle node with nobody nominated: the card a nominated whole-card pod would get too
    ext, ledger, _ = bind_setup()
    assert ext.filter({"Pod": admitted("u1"), "NodeNames": ["s4k", "s5k"]})["NodeNames"] == ["s4k", "s5k"]
    assert await ext.bind(bind_args("u1", node="s5k")) == {"Error": ""}
    ((_, _, alone),) = ledger.plans
    ext, ledger, _ = bind_setup()
    ext.nominate("p1", 1000, whole(), {}, ["s5k"])
    (p1_card,) = ext._held_for("u1", 0)["s5k"]["p1"][1]
    assert alone.cards == (p1_card,)  # the test means something: without the nomination u1 takes p1's card
    assert ext.filter({"Pod": admitted("u1"), "NodeNames": ["s4k", "s5k"]})["NodeNames"] == ["s4k", "s5k"]
    assert await ext.bind(bind_args("u1", node="s5k")) == {"Error": ""}
    ((_, _, plan),) = ledger.plans
    assert p1_card not in plan.cards
    assert [a.uid for a in ext.nominations.ahead_of("s5k", "q", 0)] == ["p1"]  # u1's bind leaves p1 nominated
    # p1's own bind ends its nomination
    ext.filter({"Pod": {**admitted("p1"), "status": {"nominatedNodeName": "s5k"}}, "NodeNames": ["s4k", "s5k"]})
    assert await ext.bind(bind_args("p1", node="s4k")) == {"Error": ""}
    assert not ext.nominations
