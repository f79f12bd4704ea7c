"""`mtsched explain` (issue 13 item 3): tables over the pure core, every reason with its numbers, holders and fix,
checked against what the filter itself answers for the same cards."""

from __future__ import annotations

from collections import Counter
from typing import Any, cast

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from redis.asyncio import Redis

from controller.explain import ExplainError, explain_handler, gather, parse_ref, to_json, to_text
from shared.domain.explain import Explanation, explain
from shared.domain.fit import USE_UUID, fit, gen_reason
from shared.domain.placement import node_requirement
from shared.domain.request import PIN_ANNOTATION, SliceRequest, pod_request
from shared.domain.state import CardRecord, NodeSnapshot, Reservation
from shared.kube import Kube, KubeError
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.unit._k8s import VGPU, cfg, ctr, pod, slice_ctr

MIXED = cfg((96, 160))


def rec(i: int, cap: int = 96, mem: int = 0, cores: int = 0, slices: int = 0, limit: int = 16,
        health: str = "ok") -> CardRecord:
    return CardRecord(i, cap, mem, cap - mem, 16, cores, 16 - cores, slices, limit, health)


def res(uid: str, card: int, mem: int, cores: int = 1, slices: int = 1, pod: str = "", state: str = "bound"
        ) -> Reservation:
    return Reservation(uid, (card,), mem, cores, slices, state, 0, pod=pod or f"ns/{uid}")


def snap(name: str, *cards: CardRecord, reservations: tuple[Reservation, ...] = (), error: str = ""
         ) -> NodeSnapshot:
    return NodeSnapshot(name, 1, error, {c.index: c for c in cards}, {r.uid: r for r in reservations})


def request(p: dict[str, Any]) -> SliceRequest:
    req = pod_request(p, MIXED)
    assert req is not None
    return req


SLICE64 = pod(slice_ctr(memory=64, cores=4))
FULL_CARD_3 = snap("n1", rec(3, mem=64, cores=2, slices=2),
                   reservations=(res("a", 3, 32), res("b", 3, 32)))

# (case, pod, node snapshot, card index, reason, phrases of the detail, phrase of the fix)
CARDS: list[tuple[str, dict[str, Any], NodeSnapshot, int, str, tuple[str, ...], str]] = [
    ("memory", SLICE64, FULL_CARD_3, 3, "CardInsufficientMemory",
     ("needs 64 units, 32 free; held by ns/a (32), ns/b (32)",), "fits once ns/a ends"),
    ("memory-two-holders", pod(slice_ctr(memory=96, cores=4)), FULL_CARD_3, 3, "CardInsufficientMemory",
     ("needs 96 units, 32 free",), "fits once ns/a, ns/b end"),
    ("cores", pod(slice_ctr(memory=2, cores=8)),
     snap("n1", rec(0, mem=4, cores=12, slices=2), reservations=(res("a", 0, 2, 10), res("b", 0, 2, 2))), 0,
     "CardInsufficientCore", ("needs 8 core group(s), 4 free",), "fits once ns/a ends"),
    ("slices", pod(slice_ctr(memory=2, cores=1)),
     snap("n1", rec(0, mem=4, cores=2, slices=2, limit=2), reservations=(res("a", 0, 2), res("b", 0, 2))), 0,
     "CardTimeSlicingExhausted", ("needs 1 slice(s), 2/2 in use",), "fits once ns/a ends"),
    ("exclusive", pod(ctr("x", {VGPU: 1, "mthreads.com/sgpu-memory": 96, "mthreads.com/sgpu-core": 16})),
     snap("n1", rec(0, mem=2, cores=1, slices=1), reservations=(res("a", 0, 2, pod="ns/small", state="pending"),)),
     0, "CardInsufficientMemory", ("needs 96 units, 94 free", "ns/small (2, pending)"), "fits once ns/small ends"),
    ("multi-card-needs-idle", pod(ctr("x", {VGPU: 2})),
     snap("n1", rec(0, mem=2, cores=1, slices=1), rec(1), reservations=(res("a", 0, 2),)), 0,
     "ExclusiveDeviceAllocateConflict", ("needs an idle card (whole card)",), "fits once ns/a ends"),
    ("model", pod(slice_ctr(memory=128, cores=4)), snap("n1", rec(0)), 0, "CardTypeMismatch",
     ("the card is MTT S4000 (96 units)", "sgpu-memory 128, not valid on MTT S4000"), "2, 4, 8, 16, 32, 64, 96"),
    # a whole-card pod has no sgpu-memory value to change: the advice was "ask a value MTT S4000 takes" (new-user test)
    ("whole-card-model", pod(ctr("x", {VGPU: 2}), annotations={"mtsched.io/card-memory": "160"}),
     snap("n1", rec(0), rec(1)), 0, "CardTypeMismatch",
     ("the card is MTT S4000 (96 units), the pod needs a MTT S5000 card (160 units)",),
     'wait for a MTT S5000 card, or create the pod with the annotation mtsched.io/card-memory: "96" and no '
     'sgpu-memory'),
    # pinned to the other model: the pin and a value of this card's model (the review: 128 is none)
    ("pinned-slice-model", pod(slice_ctr(memory=128, cores=4), annotations={"mtsched.io/card-memory": "160"}),
     snap("n1", rec(0)), 0, "CardTypeMismatch", ("the pod needs a MTT S5000 card (160 units)",),
     'mtsched.io/card-memory: "96" and an sgpu-memory MTT S4000 takes (2, 4, 8, 16, 32, 64, 96)'),
    ("cordoned", SLICE64, snap("n1", rec(0, health="cordoned")), 0, "CardCordoned",
     ("hami.io/device-cordon",), "remove n1-mthreads-0 from hami.io/device-cordon"),
    ("unhealthy", SLICE64, snap("n1", rec(0, health="unhealthy")), 0, "CardNotHealth", ("unhealthy",), "repair"),
    ("uuid", pod(slice_ctr(memory=2, cores=1), annotations={USE_UUID: "n1-mthreads-1"}), snap("n1", rec(0), rec(1)),
     0, "CardUuidMismatch", ("n1-mthreads-0 is excluded",), "change those annotations"),
    ("over-limit", pod(slice_ctr("c1", memory=2, cores=1), slice_ctr("c2", memory=2, cores=1),
                       slice_ctr("c3", memory=2, cores=1)),
     snap("n1", rec(0, limit=2)), 0, "CardTimeSlicingExhausted", ("needs 3 slice(s), 0/2 in use",),
     "not even this card idle takes it"),
    ("drift", SLICE64, snap("n1", rec(0, mem=64, cores=2, slices=1), reservations=(res("a", 0, 8),)), 0,
     "CardInsufficientMemory", ("needs 64 units, 32 free; held by ns/a (8)",), "more than its reservations explain"),
    ("removed", SLICE64, snap("n1", rec(0), rec(5, mem=8, health="removed"), reservations=(res("gone", 5, 8),)), 5,
     "CardNotFound", ("no longer reports", "held by ns/gone (8)"), "offered again"),
]


@pytest.mark.parametrize(("case", "p", "s", "card", "reason", "details", "fix"), CARDS, ids=[c[0] for c in CARDS])
def test_card_reason_numbers_holders_and_fix(case: str, p: dict[str, Any], s: NodeSnapshot, card: int, reason: str,
                                             details: tuple[str, ...], fix: str) -> None:
    ann = p["metadata"].get("annotations") or {}
    e = explain("ns/p", request(p), ann, {s.node: s}, "spread")
    why = next(c for c in e.nodes[0].cards if c.index == card)
    assert why.reason == reason
    for d in details:
        assert d in why.detail, why.detail
    assert fix in why.fix, why.fix
    # the node's verdict is the filter's own answer, and the card reasons add up to it
    filt = fit(s.states(), request(p), ann, "spread")
    assert e.nodes[0].reason == filt.reason and e.nodes[0].fits == filt.cards
    offered = Counter(c.reason for c in e.nodes[0].cards if c.reason and c.health != "removed")
    if not filt.ok and "AllocatedCardsInsufficientRequest" not in filt.reason:
        assert gen_reason(offered, len(s.states())) == filt.reason


def test_whole_node_reasons() -> None:
    small = snap("one-card", rec(0))
    e = explain("ns/p", request(pod(ctr("x", {VGPU: 2}))), {}, {"one-card": small}, "spread")
    assert e.nodes[0].reason == "1/1 NodeInsufficientDevice"
    assert e.nodes[0].detail == "the node offers 1 card(s), the pod needs 2"
    half = snap("two", rec(0), rec(1, mem=2, cores=1, slices=1), reservations=(res("a", 1, 2),))
    e = explain("ns/p", request(pod(ctr("x", {VGPU: 2}))), {}, {"two": half}, "spread")
    assert "AllocatedCardsInsufficientRequest" in e.nodes[0].reason and "1 of the 2 cards" in e.nodes[0].detail


def test_mismatched_node_names_its_problem_and_the_summary_counts_it() -> None:
    err = "160 units per card (320/2) is no configured card model; memoryPerCard [96]"
    snaps = {"s5000-a": snap("s5000-a", error=err), "s4000-b": FULL_CARD_3}
    e = explain("ns/p", request(SLICE64), {}, snaps, "spread")
    by = {n.node: n for n in e.nodes}
    assert by["s5000-a"].mismatch == "model" and by["s5000-a"].reason == f"node unregistered: {err}"
    assert "no card fits on any of 2 candidate node(s)" in e.summary
    assert "1 node(s) offer no card because their capacity, label or card model disagrees" in e.summary
    text = to_text(e)
    assert f"node s5000-a: offers no card (model mismatch): {err}" in text
    # a quarantine is an error but no mismatch
    q = explain("ns/p", request(SLICE64), {}, {"q": snap("q", error="pods hold cards nobody accounts for")}, "spread")
    assert q.nodes[0].mismatch == "" and "disagrees" not in q.summary


def test_fitting_node_and_node_selector() -> None:
    p = pod(slice_ctr(memory=8, cores=1), nodeSelector={"pool": "a"})
    snaps = {"a1": snap("a1", rec(0), rec(1, mem=90, cores=2, slices=1)), "b1": snap("b1", rec(0))}
    labels = {"a1": {"pool": "a"}, "b1": {"pool": "b"}}
    e = explain("ns/p", request(p), {}, snaps, "spread", requirement=node_requirement(p), labels=labels)
    by = {n.node: n for n in e.nodes}
    assert "nodeSelector pool='a'" in by["b1"].excluded and by["b1"].cards == ()
    assert by["a1"].fits == (0,) and [c.reason for c in by["a1"].cards] == ["", "CardInsufficientMemory"]
    assert e.summary.startswith("fits on 1 of 1 candidate node(s) (a1 cards 0)")
    # without labels every node is a candidate
    e = explain("ns/p", request(p), {}, snaps, "spread", requirement=node_requirement(p))
    assert not any(n.excluded for n in e.nodes)


def test_unreadable_unasked_and_bound_pods() -> None:
    e = explain("ns/p", None, {}, {}, "spread", problems=('container "c": mthreads.com/sgpu-memory=3 ...',))
    assert e.summary.startswith("the filter places this pod nowhere") and e.nodes == ()
    assert "asks for no sliced card" in explain("ns/p", None, {}, {}, "spread").summary
    e = explain("ns/p", request(SLICE64), {}, {"n1": FULL_CARD_3}, "spread", bound="n1")
    assert e.summary == "bound to n1"


def test_json_is_the_same_data() -> None:
    e = explain("ns/p", request(SLICE64), {}, {"n1": FULL_CARD_3}, "spread")
    doc = orjson.loads(to_json(e))
    assert doc["pod"] == "ns/p" and doc["nodes"][0]["cards"][0]["reason"] == "CardInsufficientMemory"
    assert doc["nodes"][0]["cards"][0]["holders"][0] == {"pod": "ns/a", "memory": 32, "cores": 1, "slices": 1,
                                                         "state": "bound"}
    assert Explanation(**{k: doc[k] for k in ("pod", "request", "summary")}).pod == "ns/p"
    text = to_text(e)
    assert "card 3 (MTT S4000, 64/96 units" in text
    assert "CardInsufficientMemory: needs 64 units, 32 free; held by ns/a (32), ns/b (32)" in text


@pytest.mark.parametrize("ref", ["", "p", "ns/", "/p", "a/b/c", "NS/p", "ns/p q", None, 3])
def test_bad_pod_reference_is_a_400_naming_the_value(ref: object) -> None:
    with pytest.raises(ExplainError) as info:
        parse_ref(ref)
    assert info.value.status == 400 and "allowed: NAMESPACE/NAME" in str(info.value)


def test_good_pod_reference() -> None:
    assert parse_ref("kube-system/my.pod-1") == ("kube-system", "my.pod-1")


class PodOnlyKube:
    """The one call gather() makes besides listing nodes: get_pod (the pod here, or a 404)."""

    def __init__(self, pods: dict[tuple[str, str], dict[str, Any]]):
        self.pods = pods

    async def get_pod(self, ns: str, name: str) -> dict[str, Any]:
        if (ns, name) not in self.pods:
            raise KubeError(404, {"message": f'pods "{name}" not found'}, "GET pod")
        return self.pods[(ns, name)]


async def test_endpoint_answers_every_case_without_a_500() -> None:
    mirror = Mirror(Ledger(Redis()))  # never connects: the handler reads only .ready and .nodes
    p = dict(SLICE64, metadata={"name": "p", "namespace": "ns", "uid": "u"})
    kube = cast(Kube, PodOnlyKube({("ns", "p"): p}))
    app = web.Application()
    app.router.add_get("/debug/explain", explain_handler(MIXED, kube, mirror))
    async with TestClient(TestServer(app)) as client:
        r = await client.get("/debug/explain", params={"pod": "ns/p"})
        assert r.status == 503 and "not loaded" in (await r.json())["error"]
        mirror.nodes = {"n1": FULL_CARD_3}
        mirror.ready.set()
        r = await client.get("/debug/explain", params={"pod": "ns/p"})
        doc = await r.json()
        assert r.status == 200 and doc["nodes"][0]["cards"][0]["reason"] == "CardInsufficientMemory"
        r = await client.get("/debug/explain", params={"pod": "ns/p", "output": "text"})
        assert r.status == 200 and "needs 64 units, 32 free; held by ns/a (32), ns/b (32)" in await r.text()
        for params, status, phrase in (({"pod": "ns/p", "output": "yaml"}, 400, "allowed: json, text"),
                                       ({}, 400, "allowed: NAMESPACE/NAME"),
                                       ({"pod": "ns/nobody"}, 404, "cannot read pod ns/nobody")):
            r = await client.get("/debug/explain", params=params)
            assert r.status == status and phrase in (await r.json())["error"], await r.text()
    app = web.Application()
    app.router.add_get("/debug/explain", explain_handler(MIXED, None, mirror))
    async with TestClient(TestServer(app)) as client:
        r = await client.get("/debug/explain", params={"pod": "ns/p"})
        assert r.status == 503 and "no API client" in (await r.json())["error"]
    verdict = ["no watcher has kept the ledger current for 95 s"]  # the extender's, read at each call
    app = web.Application()
    app.router.add_get("/debug/explain", explain_handler(MIXED, kube, mirror, lambda: verdict[0]))
    async with TestClient(TestServer(app)) as client:
        r = await client.get("/debug/explain", params={"pod": "ns/p"})
        assert r.status == 200 and (await r.json())["summary"].startswith(f"placed nowhere now: {verdict[0]}")
        verdict[0] = ""
        r = await client.get("/debug/explain", params={"pod": "ns/p"})
        assert r.status == 200 and not (await r.json())["summary"].startswith("placed nowhere now")


@pytest.mark.parametrize(("bound", "asks", "says_why"), [
    ("", True, True),  # pending, asking for a slice: the extenders place it nowhere now, whatever the cards say
    ("n1", True, False),  # bound already: as it is
    ("", False, False),  # no slice asked: not the extenders' business
])
def test_an_unkept_ledger_comes_first_for_a_pending_slice_pod(bound: str, asks: bool, says_why: bool) -> None:
    why = "no watcher has kept the ledger current for 120 s (watchersLostAfterSeconds is 90): ..."
    req = request(SLICE64) if asks else None
    e = explain("ns/p", req, {}, {"n1": snap("n1", rec(0))}, "spread", bound=bound, unkept=why)
    kept = explain("ns/p", req, {}, {"n1": snap("n1", rec(0))}, "spread", bound=bound)
    if says_why:
        assert e.summary == f"placed nowhere now: {why}; once a watcher keeps it: {kept.summary}", e.summary
        assert e.nodes == kept.nodes  # the cards as they are
    else:
        assert e == kept


@pytest.mark.parametrize("pin", ["nope", "S5000"])
async def test_a_bound_pod_is_explained_as_booked_whatever_its_pin_says_now(pin: str) -> None:
    """Its owner may change the pin after the bind; the watchers book what it holds without it (held_request), and
    explain, which judges a bound pod as the watchers book it, said its request could not be read."""
    p = pod(slice_ctr(memory=32), annotations={PIN_ANNOTATION: pin}, name="p", nodeName="n1")
    p["metadata"].update(namespace="ns", uid="u")
    kube = cast(Kube, PodOnlyKube({("ns", "p"): p}))

    async def snaps() -> dict[str, NodeSnapshot]:
        return {"n1": snap("n1", rec(0, 96, 32, 8, 1), reservations=(res("u", 0, 32, 8),))}

    e = await gather(kube, "ns/p", snaps, cfg((96,)))
    assert e.problems == () and e.request.startswith("slice of one card: 32 units"), e
