"""Card-aware preemption: the victim choice (shared/domain/preempt.py) by a table, the preempt arguments
(shared/domain/preempt_args.py) and the verb on the real extender with recording stand-ins."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from controller.preempt import Preemption
from shared.domain.extender_args import ArgsError
from shared.domain.fit import USE_UUID, CardState
from shared.domain.node import Card
from shared.domain.preempt import KEPT, NO_CARD, UNCHANGED, Holding, choose_victims
from shared.domain.preempt_args import MAX_VICTIMS, parse_preemption_args
from shared.domain.request import SliceRequest
from shared.domain.state import CardRecord, NodeSnapshot, Reservation
from tests.unit._k8s import VGPU, cfg, slice_request, whole_request
from tests.unit._servers import FakeKube, extender

S4000 = cfg((96,))
# a pod on the node: (uid, cards, memory per card, cores per card, priority)
Held = tuple[str, tuple[int, ...], int, int, int]


def sl(memory: int, cores: int = 4) -> SliceRequest:
    return slice_request(S4000, memory, cores)


def whole(n: int = 1) -> SliceRequest:
    return whole_request(S4000, n)


def node(held: list[Held], cards: int = 2, max_slices: int = 16) -> tuple[list[CardState], dict[str, Holding]]:
    holdings = {uid: Holding(on, mem, cores, 1) for uid, on, mem, cores, _ in held}
    states = [CardState(Card("n1", i, 96, max_slices),
                        sum(h.memory for h in holdings.values() if i in h.cards),
                        sum(h.cores for h in holdings.values() if i in h.cards),
                        sum(h.slices for h in holdings.values() if i in h.cards)) for i in range(cards)]
    return states, holdings


FULL = [("a", (0,), 32, 4, 1), ("b", (0,), 32, 4, 1), ("c", (0,), 32, 4, 1),
        ("d", (1,), 32, 4, 2), ("e", (1,), 32, 4, 2), ("f", (1,), 32, 4, 2)]
HIGH_HELD = [("h0", (0,), 48, 4, 9999), ("l0", (0,), 48, 4, 1), ("h1", (1,), 48, 4, 9999), ("l1", (1,), 48, 4, 1)]

CASES: list[tuple[str, list[Held], list[str], SliceRequest, str, tuple[str, ...], tuple[int, ...], dict[str, Any]]] = [
    # name, pods on the node, kube-scheduler's victims, preemptor, outcome, victims kept, cards freed, node opts
    ("proposal on one card frees it", FULL, ["b", "c"], sl(64), KEPT, ("b", "c"), (0,), {}),
    ("proposal across cards frees none", HIGH_HELD, ["l0", "l1"], sl(64), NO_CARD, (), (), {}),
    # kube-scheduler needs each of its victims (tests/unit/test_redteam_preempt_reprieve.py): never a part
    ("a victim on another card stays in", [("a", (0,), 64, 4, 1), ("b", (0,), 32, 4, 5), ("c", (1,), 32, 4, 1),
                                           ("d", (1,), 32, 4, 5), ("e", (1,), 32, 4, 5)],
     ["a", "c"], sl(64), KEPT, ("a", "c"), (0,), {}),
    ("more victims than one card needs", [("a", (0,), 32, 4, 1), ("b", (0,), 32, 4, 1), ("c", (0,), 32, 4, 1),
                                          ("d", (1,), 64, 4, 1), ("e", (1,), 32, 4, 1)],
     ["a", "b", "d"], sl(64), KEPT, ("a", "b", "d"), (1,), {}),
    ("priorities do not split it", [("a", (0,), 64, 4, 5), ("b", (0,), 32, 4, 9), ("c", (1,), 64, 4, 3),
                                    ("d", (1,), 32, 4, 9)],
     ["a", "c"], sl(64), KEPT, ("a", "c"), (1,), {}),
    ("more of one card than it needs", [("a", (0,), 16, 1, 1), ("b", (0,), 16, 1, 1), ("c", (0,), 64, 1, 1),
                                        ("d", (1,), 96, 1, 9)],
     ["a", "b", "c"], sl(64), KEPT, ("a", "b", "c"), (0,), {}),
    ("a victim holding no card is kept", FULL, ["cpu-hog", "b", "c"], sl(64), KEPT, ("cpu-hog", "b", "c"), (0,),
     {}),
    ("cards already fit: kube-scheduler's choice stands", [("a", (0,), 32, 4, 1)], ["a"], sl(32), UNCHANGED,
     ("a",), (), {}),
    ("slice limit: one victim frees one instance", [("a", (0,), 8, 1, 1), ("b", (0,), 8, 1, 1),
                                                    ("c", (1,), 8, 1, 1), ("d", (1,), 8, 1, 1)],
     ["a", "c"], sl(8, 1), KEPT, ("a", "c"), (1,), {"max_slices": 2}),
    ("exclusive needs an idle card", [("a", (0,), 32, 4, 1), ("b", (0,), 32, 4, 1), ("c", (1,), 96, 16, 1)],
     ["a", "c"], whole(), KEPT, ("a", "c"), (1,), {}),
    ("exclusive: a card left with a pod is not freed", [("a", (0,), 32, 4, 1), ("b", (0,), 32, 4, 1),
                                                        ("c", (1,), 96, 16, 1)],
     ["a"], whole(), NO_CARD, (), (), {}),
    ("two whole cards", [("a", (0,), 96, 16, 1), ("b", (1,), 96, 16, 1), ("c", (2,), 32, 4, 1),
                                            ("d", (2,), 32, 4, 1)],
     ["a", "b", "c"], whole(2), KEPT, ("a", "b", "c"), (0, 1), {"cards": 3}),
    ("a two-card holder frees two", [("m", (0, 1), 96, 16, 1), ("c", (2,), 96, 16, 1)],
     ["m", "c"], whole(2), KEPT, ("m", "c"), (1, 2), {"cards": 3}),
    ("the preemptor's card pin is honoured", FULL, ["b", "c", "e", "f"],
     sl(64), KEPT, ("b", "c", "e", "f"), (1,), {"annotations": {USE_UUID: "n1-mthreads-1"}}),
]


@pytest.mark.parametrize(("held", "proposed", "req", "outcome", "kept", "cards", "opts"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_victim_choice(held: list[Held], proposed: list[str], req: SliceRequest, outcome: str,
                       kept: tuple[str, ...], cards: tuple[int, ...], opts: dict[str, Any]) -> None:
    annotations = opts.pop("annotations", {})
    states, holdings = node(held, **opts)
    choice = choose_victims(states, holdings, proposed, req, annotations)
    assert (choice.outcome, choice.victims, choice.cards) == (outcome, kept, cards), choice
    if outcome == NO_CARD:
        assert "card 0: " in choice.reason and "card 1: " in choice.reason


def test_no_card_reason_names_the_rule() -> None:
    states, holdings = node(HIGH_HELD)
    choice = choose_victims(states, holdings, ["l0", "l1"], sl(64), {})
    assert choice.reason == "card 0: CardInsufficientMemory; card 1: CardInsufficientMemory"


# -- arguments -----------------------------------------------------------------------------------

def ppod(uid: str = "u1", priority: object = 1000) -> dict[str, Any]:
    return {"metadata": {"uid": uid, "name": "p", "namespace": "ns"},
            "spec": {"priority": priority, "containers": [{"name": "c"}]}}


def test_meta_victims_as_kube_scheduler_sends_them() -> None:
    a = parse_preemption_args({"Pod": ppod(), "NodeNameToVictims": None, "NodeNameToMetaVictims": {
        "n1": {"Pods": [{"UID": "v1"}, {"UID": "v2"}], "NumPDBViolations": 1}}})
    assert a.meta and a.priority == 1000
    assert [v.uid for v in a.nodes["n1"].pods] == ["v1", "v2"] and a.nodes["n1"].pdb_violations == 1


def test_full_victims_carry_their_priority() -> None:
    victim = {"metadata": {"uid": "v1", "name": "v", "namespace": "ns"}, "spec": {"priority": 5}}
    a = parse_preemption_args({"pod": ppod(), "nodenametovictims": {"n1": {"pods": [victim]}}})
    assert not a.meta and a.nodes["n1"].pods[0].priority == 5 and a.nodes["n1"].pdb_violations == 0


META = {"n1": {"Pods": [{"UID": "v1"}], "NumPDBViolations": 0}}


@pytest.mark.parametrize(("doc", "field"), [
    (None, "body"), ([], "body"),
    ({"NodeNameToMetaVictims": META}, "Pod"),
    ({"Pod": ppod(uid="a b"), "NodeNameToMetaVictims": META}, "Pod.metadata.uid"),
    ({"Pod": ppod(priority=True), "NodeNameToMetaVictims": META}, "Pod.spec.priority"),
    ({"Pod": ppod(priority=2**31), "NodeNameToMetaVictims": META}, "Pod.spec.priority"),
    ({"Pod": ppod()}, "NodeNameToMetaVictims"),
    ({"Pod": ppod(), "NodeNameToMetaVictims": META, "NodeNameToVictims": {}}, "NodeNameToMetaVictims"),
    ({"Pod": ppod(), "NodeNameToMetaVictims": []}, "NodeNameToMetaVictims"),
    ({"Pod": ppod(), "NodeNameToMetaVictims": {"N_1": META["n1"]}}, "NodeNameToMetaVictims key"),
    ({"Pod": ppod(), "NodeNameToMetaVictims": {"n1": None}}, "NodeNameToMetaVictims[n1]"),
    ({"Pod": ppod(), "NodeNameToMetaVictims": {"n1": {"Pods": []}}}, "NodeNameToMetaVictims[n1].Pods"),
    ({"Pod": ppod(), "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "v"}] * (MAX_VICTIMS + 1)}}},
     "NodeNameToMetaVictims[n1].Pods"),
    ({"Pod": ppod(), "NodeNameToMetaVictims": {"n1": {"Pods": ["v1"]}}}, "NodeNameToMetaVictims[n1].Pods[0]"),
    ({"Pod": ppod(), "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": ""}]}}},
     "NodeNameToMetaVictims[n1].Pods[0].UID"),
    ({"Pod": ppod(), "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "v"}], "NumPDBViolations": -1}}},
     "NodeNameToMetaVictims[n1].NumPDBViolations"),
    ({"Pod": ppod(), "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "v"}], "NumPDBViolations": 2}}},
     "NodeNameToMetaVictims[n1].NumPDBViolations"),
    ({"Pod": ppod(), "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "v"}, {"UID": "v"}]}}},
     "NodeNameToMetaVictims[n1].Pods"),
    ({"Pod": ppod(), "NodeNameToVictims": {"n1": {"Pods": [{"spec": {}}]}}}, "NodeNameToVictims[n1].Pods[0]"),
    ({"Pod": ppod(), "NodeNameToVictims": {"n1": {"Pods": [{"metadata": {"uid": "v", "name": "v",
                                                                         "namespace": "ns"},
                                                            "spec": {"priority": "1"}}]}}},
     "NodeNameToVictims[n1].Pods[0].spec.priority"),
])
def test_malformed_arguments_name_the_field(doc: object, field: str) -> None:
    with pytest.raises(ArgsError) as info:
        parse_preemption_args(doc)
    assert str(info.value).startswith(f"{field}:"), info.value
    assert "allowed" in str(info.value)


# -- the verb on the extender --------------------------------------------------------------------

def snapshot(held: list[Held]) -> NodeSnapshot:
    used: dict[int, list[int]] = {0: [0, 0, 0], 1: [0, 0, 0]}
    res = {}
    for uid, on, mem, cores, _ in held:
        for i in on:
            used[i][0] += mem
            used[i][1] += cores
            used[i][2] += 1
        res[uid] = Reservation(uid, on, mem, cores, 1, "bound", 1, pod=f"ns/{uid}")
    cards = {i: CardRecord(i, 96, m, 96 - m, 16, c, 16 - c, s, 16, "ok") for i, (m, c, s) in used.items()}
    return NodeSnapshot("s4k", 2, cards=cards, reservations=res)


def preemptor(uid: str = "hi", memory: str = "64") -> dict[str, Any]:
    return {"metadata": {"name": f"p-{uid}", "namespace": "ns", "uid": uid},
            "spec": {"schedulerName": "hami-scheduler", "priority": 1000, "containers": [
                {"name": "c", "resources": {"limits": {VGPU: "1", "mthreads.com/sgpu-memory": memory,
                                                       "mthreads.com/sgpu-core": "4"}}}]}}


def meta(node: str, *uids: str) -> dict[str, Any]:
    return {node: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": 0}}


async def test_verb_answers_the_whole_proposal_as_meta_victims() -> None:
    kube = FakeKube()
    ext = extender(kube=kube)
    held = [("a", (0,), 64, 4, 5), ("b", (0,), 32, 4, 9), ("c", (1,), 64, 4, 3), ("d", (1,), 32, 4, 9)]
    ext.mirror.put(snapshot(held))
    out = await Preemption(ext).preempt({"Pod": preemptor(), "NodeNameToMetaVictims": meta("s4k", "a", "c")})
    # one victim would free a card either way, but kube-scheduler needs both: its answer stands whole
    assert out == {"NodeNameToMetaVictims": {"s4k": {"Pods": [{"UID": "a"}, {"UID": "c"}], "NumPDBViolations": 0}}}
    await asyncio.sleep(0.01)
    ((reason, message),) = kube.events
    assert reason == "PreemptionCardChosen" and "s4k: cards 1 freed, 2 victims" in message, message


async def test_event_says_when_the_cards_fit_already() -> None:
    """Red team: a node whose cards already fit (UNCHANGED: kube-scheduler evicts for its own resources) was
    listed under "nodes where kube-scheduler's victims free a card" as "cards fit already": the event said its
    victims free a card where they free none the preemptor needs."""
    kube = FakeKube()
    ext = extender(kube=kube)
    ext.mirror.put(snapshot([("a", (0,), 32, 4, 1)]))
    out = await Preemption(ext).preempt({"Pod": preemptor(memory="32"), "NodeNameToMetaVictims": meta("s4k", "a")})
    assert out == {"NodeNameToMetaVictims": meta("s4k", "a")}
    await asyncio.sleep(0.01)
    ((reason, message),) = kube.events
    assert reason == "PreemptionCardChosen" and "free a card" not in message, message
    assert "s4k: its cards fit already, the victims free what kube-scheduler counts, 1 victims" in message, message


async def test_verb_drops_nodes_it_cannot_judge_or_where_no_card_is_freed() -> None:
    kube = FakeKube()
    ext = extender(kube=kube)
    ext.mirror.put(snapshot(HIGH_HELD))
    args = {"Pod": preemptor(), "NodeNameToMetaVictims": {**meta("s4k", "l0", "l1"), **meta("ghost", "x")}}
    assert await Preemption(ext).preempt(args) == {"NodeNameToMetaVictims": {}}
    await asyncio.sleep(0.01)
    ((reason, message),) = kube.events
    assert reason == "PreemptionNotHelpful"
    assert "s4k: card 0: CardInsufficientMemory; card 1: CardInsufficientMemory" in message
    assert "ghost: node unknown to the card ledger" in message
    ext.mirror.ready.clear()  # state not loaded: nothing is evicted anywhere
    assert await Preemption(ext).preempt(args) == {"NodeNameToMetaVictims": {}}


async def test_verb_leaves_pods_without_cards_to_kube_scheduler() -> None:
    ext = extender()
    cpu_pod = {"metadata": {"name": "cpu", "namespace": "ns", "uid": "u"}, "spec": {"containers": [{"name": "c"}]}}
    out = await Preemption(ext).preempt({"Pod": cpu_pod, "NodeNameToMetaVictims": meta("s4k", "v")})
    assert out == {"NodeNameToMetaVictims": meta("s4k", "v")}


async def test_http_preempt_400_on_bad_arguments() -> None:
    from aiohttp.test_utils import TestClient, TestServer

    from tests.unit._servers import extender_app

    async with TestClient(TestServer(extender_app(extender()))) as client:
        await _http_checks(client)


async def _http_checks(client: Any) -> None:
    resp = await client.post("/preempt", data=b"{")
    assert resp.status == 400 and (await resp.json())["error"].startswith("body: not JSON")
    resp = await client.post("/preempt", data=orjson.dumps({"Pod": preemptor(), "NodeNameToMetaVictims": []}))
    assert resp.status == 400 and (await resp.json())["error"].startswith("NodeNameToMetaVictims:")
    resp = await client.post("/preempt", data=orjson.dumps({"Pod": preemptor(), "NodeNameToMetaVictims": {}}))
    assert resp.status == 200 and await resp.json() == {"NodeNameToMetaVictims": {}}
