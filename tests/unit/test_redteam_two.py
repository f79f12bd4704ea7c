"""Red team (rt-two) of the nominations (controller/nominations.py, controller/in_flight.py _held_for): a nomination
kube-scheduler cleared, the filter's cost with nominations, and the verb's answer held on every node it named."""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from typing import Any

import pytest

from shared.domain.state import CardRecord, NodeSnapshot
from tests.e2e._wait import until_true
from tests.unit._servers import FakeKube, extender
from tests.unit.test_nomination_follow import stop_following
from tests.unit.test_nominations import slice_pod
from tests.unit.test_preempt import S4000, sl, snapshot

# -- nominations -------------------------------------------------------------------------------------------------


async def test_a_nomination_kube_scheduler_cleared_ends_at_the_pods_next_filter() -> None:
    """kube-scheduler clears a preemptor's nominatedNodeName when a later preemption attempt finds no candidate
    (PostFilter's NominatingInfo with an empty node, ModeOverride): its own filters stop counting it at once. The
    pod's next filter comes without the field; its nomination must end there, not 120 s after it was last seen."""
    ext = extender(cfg=S4000, kube=FakeKube())
    ext.mirror.put(snapshot([("y", (1,), 32, 4, 9999)]))  # card 0 idle, card 1 has 64 free
    ext.nominate("p1", 1000, sl(96), {}, ["s4k"])  # from the verb's answer, or a filter carrying it
    assert ext.filter({"Pod": slice_pod("q", 96, 10), "NodeNames": ["s4k"]})["NodeNames"] == []  # p1's card
    woken: list[str] = []
    ext._wake = woken.append  # type: ignore[method-assign]
    ext.filter({"Pod": slice_pod("p1", 96, 1000), "NodeNames": ["elsewhere"]})  # nominated no more
    assert not ext.nominations, list(ext.nominations.by_uid)
    assert woken == ["s4k"]
    assert ext.filter({"Pod": slice_pod("q", 96, 10), "NodeNames": ["s4k"]})["NodeNames"] == ["s4k"]


def _cluster(nodes: int) -> Any:
    ext = extender(cfg=dataclasses.replace(S4000, filter_top_k=0), kube=FakeKube())
    ext.mirror.replace_all({})

    def card(i: int, used: int) -> CardRecord:
        return CardRecord(i, 96, used, 96 - used, 16, 4 if used else 0, 12 if used else 16, 1 if used else 0, 16,
                          "ok")

    for n in range(nodes):
        ext.mirror.put(NodeSnapshot(f"n{n}", 1, cards={i: card(i, 48 if i == 0 else 0) for i in range(8)}))
    return ext


def test_a_filter_with_nominations_plans_no_nominated_node_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """5,000 nodes; 10 preemptors pending, each answered by the preempt verb on 500 nodes (kube-scheduler asks
    about max(100, 10 %) candidates) and recorded on all of them until its next filter. Measured then: 2.9 ms per
    filter without, 225-247 ms with (50 preemptors: 0.9 s; 100 with filterTopK 10: 2.8 s, the event loop blocked),
    every nominated node planned and fitted again on every filter. Now each plan is kept for its snapshot (Planned),
    with the fits made on it (~25 ms a filter): counted here, not timed (tests assert no durations), a filter after
    the first plans, lays out and fits no nominated node again."""
    import controller.fit_memo as fit_memo
    import controller.in_flight as in_flight_module

    names = [f"n{n}" for n in range(5000)]
    ext = _cluster(5000)
    for p in range(10):
        ext.nominate(f"p{p}", 1000, sl(64), {}, {f"n{(p * 500 + j) % 5000}": () for j in range(500)})
    calls: Counter[str] = Counter()
    for module, name in ((in_flight_module, "plan_ahead"), (fit_memo, "held_states"), (fit_memo, "fit")):
        real = getattr(module, name)

        def counted(*a: Any, _real: Any = real, _name: str = name, **k: Any) -> Any:
            calls[_name] += 1
            return _real(*a, **k)
        monkeypatch.setattr(module, name, counted)
    ext.filter({"Pod": slice_pod("warm", 32, 0), "NodeNames": names})
    assert calls["plan_ahead"] >= 1000  # the first filter plans the nominated nodes (the count could not be 0)
    calls.clear()
    for r in range(3):
        ext._claims.clear()
        ext.held.clear()
        ext.filter({"Pod": slice_pod(f"q{r}", 32, 0), "NodeNames": names})
    assert calls == Counter(), calls  # was: 5,000 plans and fits per filter


async def _answered(ext: Any, kube: FakeKube) -> None:
    from controller.preempt import Preemption
    from tests.unit.test_preempt import meta

    for name in ("a", "b", "c"):  # card 0 held by a low-priority victim, card 1 idle (whole-card preemptor: UNCHANGED)
        ext.mirror.put(dataclasses.replace(snapshot([(f"v-{name}", (0,), 64, 4, 1)]), node=name))
    victims = {**meta("a", "v-a"), **meta("b", "v-b"), **meta("c", "v-c")}
    p1 = slice_pod("p1", 96, 1000)
    kube.pods[("ns", "p-p1")] = p1
    out = await Preemption(ext).preempt({"Pod": p1, "NodeNameToMetaVictims": victims})
    assert set(out["NodeNameToMetaVictims"]) == {"a", "b", "c"}
    assert ext.filter({"Pod": slice_pod("q", 96, 10), "NodeNames": ["a", "b", "c"]})["NodeNames"] == []


@pytest.mark.parametrize(("then", "held"), [
    ({"status": {"nominatedNodeName": "a"}}, ["a"]),  # kube-scheduler's choice: that node alone
    ({}, []),  # it names none at the last read: kube-scheduler did not nominate it
    ({"spec": {"nodeName": "b"}}, []),  # bound meanwhile (by another replica)
    (None, []),  # deleted
])
async def test_the_verbs_answer_holds_cards_only_where_kube_scheduler_nominated_it(
        monkeypatch: pytest.MonkeyPatch, then: Any, held: list[str]) -> None:
    """The preempt verb records its preemptor on every node it answered; kube-scheduler nominates it to one. Until
    the preemptor's next filter (after its victims are gone: their grace period, 30 s by default), a lower-priority
    pod was turned away from every other node answered, which kube-scheduler's own filters leave to it (and each
    filter planned them all). Now the extender reads the pod's nominatedNodeName soon after its answer."""
    import controller.in_flight as in_flight_module

    monkeypatch.setattr(in_flight_module, "FOLLOW_AT_S", (0.01, 0.02, 0.03))
    monkeypatch.setattr(in_flight_module, "FOLLOW_EVERY_S", 0.01)
    kube = FakeKube()
    ext = extender(cfg=S4000, kube=kube)
    await _answered(ext, kube)
    woken: list[str] = []
    ext._turned_away.update("abc")
    ext._wake = woken.append  # type: ignore[method-assign]
    if then is None:
        del kube.pods[("ns", "p-p1")]
    else:
        p1 = kube.pods[("ns", "p-p1")]
        for k, v in then.items():
            p1.setdefault(k, {}).update(v)
    async def settled() -> bool:  # forgotten (its reads end), or narrowed to kube-scheduler's choice
        return not ext._following or len(ext.nominations.by_node) <= 1

    await until_true(settled, "the nomination forgotten or narrowed", timeout=5)
    await stop_following(ext)  # a nomination that lives is read while it does
    assert sorted(ext.nominations.by_node) == held
    assert sorted(woken) == sorted({"a", "b", "c"} - set(held))
    fits = ext.filter({"Pod": slice_pod("q", 96, 10), "NodeNames": ["a", "b", "c"]})["NodeNames"]
    assert fits == [n for n in "abc" if n not in held]


def _reference(ext: Any, uid: str, priority: int) -> dict[str, dict[str, Any]]:
    """_held_for as first written (no plan kept): every nominated node planned afresh."""
    from controller.fit_memo import held_states
    from shared.domain.preempt import Holding, plan_ahead

    merged = {n: dict(h) for n, h in ext.held.items()}
    for node in list(ext.nominations.by_node):
        snap = ext.mirror.get(node)
        ahead = [n.at(node) for n in ext.nominations.ahead_of(
            node, uid, priority, {*snap.reservations, *ext.held.get(node, {})})] if snap else []
        if not ahead or snap is None or snap.error:
            continue
        here = {u: b for u, b in ext.held.get(node, {}).items() if u != uid}
        holdings = {v: Holding(r.cards, r.mem, r.cores, r.slices) for a in ahead for v in a.victims
                    if (r := snap.reservations.get(v)) is not None}
        _, planned = plan_ahead(held_states(snap, here), holdings, ahead, ext.cfg.gpu_scheduler_policy)
        if planned:
            by_uid = {a.uid: a.request for a in ahead}
            merged[node] = {**here, **{u: (by_uid[u], cards) for u, cards in planned.items()}}
    return merged


def test_a_kept_plan_answers_as_a_fresh_one() -> None:
    import random

    rng = random.Random(7)
    ext = extender(cfg=S4000, kube=FakeKube())
    ext.mirror.replace_all({})
    names = [f"n{i}" for i in range(6)]

    def put(node: str) -> None:
        held = [(f"v{node}{j}", (rng.randrange(2),), rng.choice((16, 32, 48)), 4, 1) for j in range(rng.randrange(3))]
        ext.mirror.put(dataclasses.replace(snapshot(held), node=node, version=rng.randrange(1, 10**6)))

    for n in names:
        put(n)
    for _ in range(400):
        op = rng.randrange(6)
        if op == 0:
            put(rng.choice(names))  # the node changed: a new snapshot
        elif op == 1:  # a preemptor nominated (again): one node or several, with victims there
            nodes = rng.sample(names, rng.randrange(1, 4))
            snaps = {n: ext.mirror.get(n) for n in nodes}
            ext.nominate(f"p{rng.randrange(5)}", rng.choice((10, 100, 1000)), sl(rng.choice((32, 64, 96))), {},
                         {n: tuple(list(s.reservations)[:1]) for n, s in snaps.items() if s is not None})
        elif op == 2 and ext.nominations:
            ext.nominations.forget(rng.choice(list(ext.nominations.by_uid)))
        elif op == 3:  # a booking in flight, or its end
            node = rng.choice(names)
            if ext.held.get(node):
                ext.held.pop(node)
            else:
                ext.held[node] = {f"{rng.choice('bp')}{rng.randrange(5)}": (sl(16), (rng.randrange(2),))}
        elif op == 4:
            at = time.monotonic() + rng.choice((0, 200))  # some nominations lapse (or not)
            ext.nominations.clock = lambda at=at: at  # type: ignore[misc]
        for uid, prio in (("q", 0), ("p1", 100), ("p2", 1000)):
            got = ext._held_for(uid, prio)
            assert {n: dict(h) for n, h in got.items()} == _reference(ext, uid, prio)
            for node in names:
                assert {n: dict(h) for n, h in ext._held_for(uid, prio, only=node).items() if n == node} == \
                    {n: h for n, h in _reference(ext, uid, prio).items() if n == node}


def test_nominations_are_bounded_in_bytes_not_only_in_pods() -> None:
    """1,000 preemptors answered on 500 nodes with 2 victims each kept 164 MiB (MAX_NOMINATIONS is 4,096 pods)."""
    import tracemalloc

    from controller.nominations import MAX_ENTRIES, Nominations

    req = sl(64)
    tracemalloc.start()
    try:
        n = Nominations()
        for p in range(1000):
            n.record(f"p{p:04d}-" + "u" * 30, 1000, req, {},
                     {f"node-{j:05d}": (f"v{p}-{j}-a" + "x" * 26, f"v{p}-{j}-b" + "x" * 26) for j in range(500)})
        used, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert n.entries <= MAX_ENTRIES and "p0999-" + "u" * 30 in n.by_uid
    assert used < 48 * 2**20, used / 2**20
    # one answer past the bound alone: its nodes are kept, not their victims
    n.record("big", 1000, req, {}, {f"node-{j}": tuple(f"v{j}-{i}" for i in range(1024)) for j in range(300)})
    assert all(v == () for v in n.by_uid["big"].victims.values()) and n.entries <= MAX_ENTRIES
    for uid in list(n.by_uid):
        n.forget(uid)
    assert n.entries == 0 and not n.by_node


async def test_prioritize_scores_the_nodes_as_the_filter_sees_them() -> None:
    """A pod nominated to node a keeps a's idle card from pods below it (filter, bind, the top-k ranking). prioritize
    scored a as if that card were free (a and b alike), unlike the filter's own top-k ranking of them."""
    ext = extender(cfg=S4000, kube=FakeKube())
    ext.mirror.replace_all({})
    for name in ("a", "b"):  # alike: card 1 has 32 units used, card 0 idle
        ext.mirror.put(dataclasses.replace(snapshot([(f"y-{name}", (1,), 32, 4, 9999)]), node=name))
    args = {"Pod": slice_pod("q", 32, 10), "NodeNames": ["a", "b"]}
    alike = {s["Host"]: s["Score"] for s in ext.prioritize(args)}
    assert alike["a"] == alike["b"]
    ext.nominate("p1", 1000, sl(96), {}, ["a"])  # a's idle card is p1's
    got = {s["Host"]: s["Score"] for s in ext.prioritize(args)}
    assert got["a"] > got["b"], got  # binpack (this config's): a is fuller for q now, as the filter ranks it
    spread = slice_pod("q", 32, 10)
    spread["metadata"]["annotations"] = {"hami.io/node-scheduler-policy": "spread"}
    got = {s["Host"]: s["Score"] for s in ext.prioritize({**args, "Pod": spread})}
    assert got["a"] < got["b"], got
    # a pod above p1 sees a as it is
    top = {s["Host"]: s["Score"] for s in ext.prioritize({**args, "Pod": slice_pod("t", 32, 5000)})}
    assert top["a"] == top["b"]


async def test_a_nominated_pods_claim_keeps_its_card() -> None:
    """The nominated pod fits now on its node (card 0 idle; its victim v still holds card 1) and its filter claims
    card 0 until its bind. A pod below it filtered meanwhile (the next in kube-scheduler's queue) saw the claim
    replaced by the nomination's plan (card 1, once v is gone), so card 0 free: it was returned the node and claimed
    card 0 too; p1's bind then planned around that claim, found nothing and took card 0 anyway, and q's bind failed."""
    ext = extender(cfg=S4000, kube=FakeKube())
    ext.mirror.put(snapshot([("v", (1,), 96, 16, 1)]))
    ext.nominate("p1", 1000, sl(96), {}, {"s4k": ("v",)})  # the verb's answer: v is its victim
    assert ext.filter({"Pod": slice_pod("p1", 96, 1000, nominated="s4k"), "NodeNames": ["s4k"]})["NodeNames"] \
        == ["s4k"]
    assert [c for _, c in ext.held["s4k"].values()] == [(0,)]  # its claim
    got = ext.filter({"Pod": slice_pod("q", 96, 10), "NodeNames": ["s4k"]})
    assert got["NodeNames"] == [], got  # card 0 is claimed by p1, card 1 is v's (then p1's plan's)
