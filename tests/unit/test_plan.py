"""Pure planning and faithful state: reasons as counts, plan_booking / plan_on, snapshots as versioned
values, and bind reusing filter's fit (no Redis: the ledger is a recording stand-in)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, cast

import pytest
from redis.asyncio import Redis

from controller.extender import Extender
from shared.domain import fit as F
from shared.domain.fit import CardNeed, CardState, FitResult, Plan, Reasons, fit, plan_booking
from shared.domain.node import Card
from shared.domain.request import SliceRequest
from shared.domain.state import CardRecord, NodeSnapshot, Reservation, plan_on
from shared.kube import Kube
from shared.store.ledger import Ledger, ReserveOutcome
from shared.store.mirror import Mirror
from tests.unit._k8s import cfg, slice_request, whole_request
from tests.unit._servers import CFG, FakeKube, FakeLedger, bind_args, mirror
from tests.unit._servers import pod as admitted

MIXED = cfg((96, 160))


def sl(memory: int, cores: int) -> SliceRequest:
    return slice_request(MIXED, memory, cores)


def whole(n: int = 1) -> SliceRequest:
    return whole_request(MIXED, n)


def state(index: int, capacity: int = 96, memory: int = 0, cores: int = 0, slices: int = 0,
          **card: Any) -> CardState:
    return CardState(Card("n1", index, capacity, **card), memory, cores, slices)


def record(index: int, capacity: int = 96, mem_used: int = 0) -> CardRecord:
    return CardRecord(index, capacity, mem_used, capacity - mem_used, 16, 0, 16, 1 if mem_used else 0, 16, "ok")


# -- reasons as counts --------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("counts", "total", "pairs", "text"),
    [
        ({"CardInsufficientMemory": 2}, 2, (("CardInsufficientMemory", 2),), "2/2 CardInsufficientMemory"),
        ({"CardUuidMismatch": 10, "CardInsufficientMemory": 2}, 12,
         (("CardInsufficientMemory", 2), ("CardUuidMismatch", 10)),
         "10/12 CardUuidMismatch, 2/12 CardInsufficientMemory"),  # HAMi sorts the texts, not the names
        ({"CardNotHealth": 0, "CardCordoned": 1}, 1, (("CardCordoned", 1),), "1/1 CardCordoned"),
        ({}, 4, (), ""),
    ],
)
def test_reasons_are_counts_and_format_as_hamis_text(counts: dict[str, int], total: int,
                                                     pairs: tuple[tuple[str, int], ...], text: str) -> None:
    r = Reasons.of(counts, total)
    assert r.counts == pairs and r.total == total and r.names() == tuple(n for n, _ in pairs)
    assert r.text == text == F.gen_reason(counts, total)
    assert r == Reasons.of(dict(reversed(list(counts.items()))), total)  # a value: order does not matter


def test_fit_carries_counts_not_text() -> None:
    r = fit([state(0, memory=90, slices=1), state(1, healthy=False)], sl(32, 2), {})
    assert not r.ok and r.reasons == Reasons.of({"CardInsufficientMemory": 1, "CardNotHealth": 1}, 2)
    assert r.reason == "1/2 CardInsufficientMemory, 1/2 CardNotHealth"
    assert fit([state(0)], whole(2), {}).reasons == Reasons.of({"NodeInsufficientDevice": 1}, 1)


def test_aggregate_failures_reads_counts_and_node_reasons() -> None:
    failed: dict[str, Reasons | str] = {
        "a": Reasons.of({"CardCordoned": 1, "CardNotHealth": 3}, 4),
        "b": Reasons.of({"CardCordoned": 2}, 2),
        "c": "node unregistered: label cards is not a number",  # a node reason is one name, never split
    }
    assert F.aggregate_failures(failed) == [
        "2 nodes CardCordoned(a,b)", "1 nodes CardNotHealth(a)",
        "1 nodes node unregistered: label cards is not a number(c)",
    ]


# -- plan_booking -------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("states", "req", "annotations", "cards", "capacity", "need", "text"),
    [
        # spread, ties: the highest index; a slice may go to any model that can take it
        ([state(0), state(1)], sl(32, 8), {}, (1,), 96,
         CardNeed(32, 8, 1, frozenset({96}), frozenset(), False), ""),
        # mutex travels as require_idle, so the script checks it too
        ([state(0), state(1, memory=2, cores=1, slices=1)], sl(8, 2), {F.GPU_POLICY: "mutex"}, (0,), 96,
         CardNeed(8, 2, 1, frozenset({96}), frozenset(), True), ""),
        # whole cards book the whole card of the chosen model, idle
        ([state(0, capacity=160), state(1, capacity=160)], whole(2), {}, (0, 1), 160,
         CardNeed(160, 16, 1, frozenset({160}), frozenset(), True), ""),
        # nouse-gpuuuid: the denied card travels too
        ([state(0), state(1)], sl(8, 2), {F.NOUSE_UUID: "n1-mthreads-1"}, (0,), 96,
         CardNeed(8, 2, 1, frozenset({96}), frozenset({1}), False), ""),
        # no fit: no cards, no need, the counts
        ([state(0, memory=90, slices=1)], sl(32, 2), {}, (), 0, None, "1/1 CardInsufficientMemory"),
    ],
)
def test_plan_booking_table(states: list[CardState], req: SliceRequest, annotations: dict[str, str],
                            cards: tuple[int, ...], capacity: int, need: CardNeed | None, text: str) -> None:
    plan = plan_booking(states, req, annotations)
    assert (plan.cards, plan.capacity, plan.need, plan.reason) == (cards, capacity, need, text)
    assert plan.ok == bool(cards)
    # given the fit of the same request on the same states, it plans the same without fitting again
    assert plan_booking(states, req, annotations, fitted=fit(states, req, annotations)) == plan


def test_plan_booking_with_a_fitted_result_does_not_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    states = [state(0), state(1)]
    fitted = fit(states, sl(8, 2), {})

    def no_fit(*_: Any) -> FitResult:
        raise AssertionError("fit() called although a fit was given")

    monkeypatch.setattr(F, "fit", no_fit)
    assert plan_booking(states, sl(8, 2), {}, fitted=fitted).cards == fitted.cards == (1,)


# -- plan_on: a node's snapshot and the pod's own booking -------------------------------------------

def test_plan_on_sends_the_pods_existing_booking_again() -> None:
    res = Reservation("u1", (0,), 8, 2, 1, "pending", 1)
    snap = NodeSnapshot("n1", 3, cards={0: record(0, 160, 8), 1: record(1, 160)}, reservations={"u1": res})
    assert plan_on(snap, "u1", sl(8, 2), {}, "spread") == Plan((0,), 160, CardNeed(8, 2, 1))
    # its card left the node: the booking still goes (the script answers with it), capacity unknown
    gone = dataclasses.replace(snap, cards={1: record(1, 160)})
    assert plan_on(gone, "u1", sl(8, 2), {}, "spread") == Plan((0,), 0, CardNeed(8, 2, 1))
    # another pod: a fresh plan on the states (spread: the emptier card)
    assert plan_on(snap, "u2", sl(8, 2), {}, "spread") == plan_booking(snap.states(), sl(8, 2), {}, "spread")


# -- snapshots: immutable values with a version ------------------------------------------------------

def test_every_snapshot_value_gets_the_next_seq() -> None:
    a = NodeSnapshot("n1", 1, cards={0: record(0)})
    b = NodeSnapshot.from_json({"node": "n1", "version": 1, "cards": {"0": dataclasses.asdict(record(0))}})
    c = dataclasses.replace(a)
    assert a == b == c  # the same value ...
    assert a.seq < b.seq < c.seq  # ... made three times: three versions
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.version = 2  # type: ignore[misc]


def test_the_mirror_replaces_a_changed_node_whole_with_a_newer_seq() -> None:
    m = Mirror(Ledger(Redis()))
    card = {"capacity": 96, "mem_used": 0, "mem_free": 96, "cores": 16, "cores_used": 0, "cores_free": 16,
            "slices": 0, "slice_limit": 16, "health": "ok"}
    m.put(NodeSnapshot("n", 1, cards={0: CardRecord.from_json(0, card)}))  # (a new node is read, not applied)
    first = m.nodes["n"]
    assert m.apply({"node": "n", "version": 2, "kind": "mark_bound", "full": False, "uid": "u",
                    "res": {"cards": "0", "mem": 8, "cores": 1, "slices": 1, "state": "bound", "created": 1}}) is None
    second = m.nodes["n"]
    assert second is not first and second.seq > first.seq
    assert first.reservations == {} and list(second.reservations) == ["u"]  # the old value did not change
    assert m.apply({"node": "n", "version": 2, "kind": "mark_bound"}) is None  # already had it: no new value
    assert m.nodes["n"] is second


# -- bind reuses filter's fit ------------------------------------------------------------------------

class PlanLedger(FakeLedger):
    """Records the plans bind sends; books them as planned (capacity from the plan)."""

    def __init__(self) -> None:
        super().__init__()
        self.plans: list[tuple[str, str, Plan]] = []

    async def place(self, node: str, uid: str, plan: Plan, pod: str = "",
                    hold_ms: int = 0) -> tuple[ReserveOutcome, None]:
        await super().place(node, uid)
        self.plans.append((node, uid, plan))
        return ReserveOutcome(True, plan.cards, capacity=plan.capacity), None


class AnnotatingKube(FakeKube):
    def __init__(self) -> None:
        super().__init__()
        self.annotations: list[Mapping[str, str]] = []

    async def bind(self, ns: str, name: str, uid: str, node: str, annotations: Mapping[str, str],
                   until: float | None = None) -> None:
        self.annotations.append(annotations)
        await super().bind(ns, name, uid, node, annotations)


def count_fits(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one at each call of shared.domain.fit.fit from then on (which still fits)."""
    calls: list[int] = []
    real_fit = F.fit

    def counting_fit(*args: Any, **kwargs: Any) -> FitResult:
        calls.append(1)
        return real_fit(*args, **kwargs)

    monkeypatch.setattr(F, "fit", counting_fit)
    return calls


def bind_setup() -> tuple[Extender, PlanLedger, AnnotatingKube]:
    ledger, kube = PlanLedger(), AnnotatingKube()
    return Extender(CFG, cast(Ledger, ledger), mirror(), cast(Kube, kube)), ledger, kube


async def test_bind_sends_filters_fit_without_fitting_again(monkeypatch: pytest.MonkeyPatch) -> None:
    ext, ledger, kube = bind_setup()
    assert ext.filter({"Pod": admitted("u1"), "NodeNames": ["s4k", "s5k"]})["NodeNames"] == ["s4k", "s5k"]
    calls = count_fits(monkeypatch)
    assert await ext.bind(bind_args("u1", node="s5k")) == {"Error": ""}
    assert calls == []  # the memoized fit of the node at the same seq was reused
    ((node, uid, plan),) = ledger.plans
    assert (node, uid, plan.cards, plan.capacity) == ("s5k", "u1", (1,), 160)
    assert plan.need == CardNeed(32, 8, 1, frozenset({160}), frozenset(), False)  # the models on the node
    assert len(kube.annotations) == 1


async def test_bind_plans_afresh_when_the_node_changed_since_filter(monkeypatch: pytest.MonkeyPatch) -> None:
    ext, ledger, _ = bind_setup()
    ext.filter({"Pod": admitted("u1"), "NodeNames": ["s5k"]})
    # another pod took card 1 meanwhile (a new snapshot, a new seq; the version number happens to be the same)
    ext.mirror.put(NodeSnapshot("s5k", 1, cards={0: record(0, 160), 1: record(1, 160, 150)}))
    calls = count_fits(monkeypatch)
    assert await ext.bind(bind_args("u1", node="s5k")) == {"Error": ""}
    assert calls == [1]
    assert [p.cards for _, _, p in ledger.plans] == [(0,)]


async def test_filter_reply_is_hamis_text_and_memo_holds_counts() -> None:
    ext, _, _ = bind_setup()
    ext.mirror.put(NodeSnapshot("s4k", 1, cards={0: record(0, 96, 90), 1: record(1, 96, 90)}))
    out = ext.filter({"Pod": admitted("u1"), "NodeNames": ["s4k", "s5k"]})
    assert out["NodeNames"] == ["s5k"] and out["FailedNodes"] == {"s4k": "2/2 CardInsufficientMemory"}
    fitted = ext.memo.fitted("s4k", ext.mirror.nodes["s4k"], ext.pods.get("u1").request,  # type: ignore[union-attr,arg-type]
                             {}, CFG.gpu_scheduler_policy)
    assert fitted is not None and fitted.reasons == Reasons.of({"CardInsufficientMemory": 2}, 2)
