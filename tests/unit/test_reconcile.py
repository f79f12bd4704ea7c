"""diff_node: every way a node's ledger can differ from the API's truth, as a table."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shared.domain.annotations import PodUsage
from shared.domain.node import Card, Inventory
from shared.domain.reconcile import Unrecorded, diff_node, offers_cards, quarantine_reason, recovered_usage, summarize
from shared.domain.request import Mode, SliceRequest
from shared.domain.state import CardRecord, NodeSnapshot, Reservation

NOW = 1_000_000_000
KEEP = 10_000
OLD = NOW - 60_000  # older than the keep window
N = "n1"


def inv(*caps: int, cordoned: tuple[int, ...] = (), error: str = "") -> Inventory:
    if error:
        return Inventory(N, error=error)
    return Inventory(N, tuple(Card(N, i, c, cordoned=i in cordoned) for i, c in enumerate(caps)))


def card(i: int, cap: int, mem: int = 0, cores: int = 0, slices: int = 0, health: str = "ok",
         limit: int = 16) -> CardRecord:
    return CardRecord(i, cap, mem, max(0, cap - mem), 16, cores, max(0, 16 - cores), slices, limit, health)


def res(uid: str, cards: tuple[int, ...], mem: int, cores: int, state: str = "bound", created: int = OLD,
        slices: int = 1) -> Reservation:
    return Reservation(uid, cards, mem, cores, slices, state, created, created if state == "bound" else 0, f"ns/{uid}")


def snap(*cards: CardRecord, reservations: tuple[Reservation, ...] = (), error: str = "") -> NodeSnapshot:
    return NodeSnapshot(N, 5, error, {c.index: c for c in cards}, {r.uid: r for r in reservations})


def use(cards: tuple[int, ...], mem: int, cores: int, slices: int = 1) -> PodUsage:
    return PodUsage(N, cards, mem, cores, slices)


A = use((0,), 8, 2)
HELD = snap(card(0, 96, 8, 2, 1), card(1, 96), reservations=(res("a", (0,), 8, 2),))

CASES = [
    # (id, snapshot, inventory, holders, expected kinds, suspects, remove)
    ("in sync", HELD, inv(96, 96), {"a": A}, {}, (), False),
    ("in sync, but not compared since Redis's process changed", replace(HELD, verified=False), inv(96, 96),
     {"a": A}, {"unverified": 1}, (), False),
    ("unverified and a holder lost with the failover", replace(snap(card(0, 96), card(1, 96)), verified=False),
     inv(96, 96), {"a": A}, {"unverified": 1, "missing_holder": 1}, (), False),
    ("unverified, gone from the API and holding nothing: removed all the same",
     replace(snap(card(0, 96)), verified=False), None, {}, {}, (), True),
    ("empty and in sync", snap(card(0, 96)), inv(96), {}, {}, (), False),
    ("node missing from the ledger", None, inv(96), {}, {"node_missing": 1}, (), False),
    ("node missing, held by a pod (re-created under it)", None, None, {"a": A}, {"node_missing": 1}, (), False),
    ("nothing anywhere", None, None, {}, {}, (), False),
    ("missing holder", snap(card(0, 96), card(1, 96)), inv(96, 96), {"a": A}, {"missing_holder": 1}, (), False),
    ("changed holder, pending reservation: the record wins",
     snap(card(0, 96, 8, 2, 1), card(1, 96), reservations=(res("a", (1,), 8, 2, state="pending"),)),
     inv(96, 96), {"a": A}, {"changed_holder": 1, "usage": 2}, (), False),
    # a bound reservation is what our bind booked: a record that says otherwise is no difference (KEPT below)
    ("record moved to another card after bind, card hashes drifted too",
     snap(card(0, 96, 8, 2, 1), card(1, 96), reservations=(res("a", (1,), 8, 2),)),
     inv(96, 96), {"a": A}, {"usage": 2}, (), False),
    ("pending long after its pod was bound",
     snap(card(0, 96, 8, 2, 1), reservations=(res("a", (0,), 8, 2, state="pending"),)), inv(96), {"a": A},
     {"unbound_holder": 1}, (), False),
    ("pending, young, pod bound: settling", snap(card(0, 96, 8, 2, 1),
                                                 reservations=(res("a", (0,), 8, 2, "pending", NOW - 100),)),
     inv(96), {"a": A}, {}, (), False),
    ("stale bound reservation is a suspect, not a verdict", HELD, inv(96, 96), {}, {}, ("a",), False),
    ("young reservation without holder: settling", snap(card(0, 96, 8, 2, 1),
                                                         reservations=(res("a", (0,), 8, 2, created=NOW - 5),)),
     inv(96), {}, {}, (), False),
    ("pending reservation without holder: the janitor's", snap(card(0, 96, 8, 2, 1), reservations=(
        res("a", (0,), 8, 2, state="pending"),)), inv(96), {}, {}, (), False),
    ("direct write to a card hash", snap(card(0, 96, 112, 2, 1), reservations=(res("a", (0,), 8, 2),)),
     inv(96), {"a": A}, {"usage": 1}, (), False),
    ("free that does not match used", snap(replace(card(0, 96, 8, 2, 1), mem_free=96),
                                           reservations=(res("a", (0,), 8, 2),)),
     inv(96), {"a": A}, {"usage": 1}, (), False),
    ("capacity differs", snap(card(0, 160)), inv(96), {}, {"card": 1}, (), False),
    ("cordon not applied", snap(card(0, 96)), inv(96, cordoned=(0,)), {}, {"card": 1}, (), False),
    ("card the node no longer reports", snap(card(0, 96), card(1, 96)), inv(96), {}, {"card": 1}, (), False),
    ("removed card still held is fine", snap(card(0, 96), card(1, 96, 8, 2, 1, health="removed"),
                                             reservations=(res("b", (1,), 8, 2),)),
     inv(96), {"b": use((1,), 8, 2)}, {}, (), False),
    ("card missing", snap(card(0, 96)), inv(96, 96), {}, {"card": 1}, (), False),
    ("reservation on a card the ledger lacks", snap(card(1, 96), reservations=(res("a", (0,), 8, 2),)),
     inv(96, 96), {"a": A}, {"card": 1, "usage": 1}, (), False),
    ("node error not applied", snap(card(0, 96)), inv(error="bad capacity"), {}, {"node_error": 1, "card": 1}, (),
     False),
    ("node gone, nothing held: remove", snap(card(0, 96)), None, {}, {}, (), True),
    ("node gone, held: keep, not remove", HELD, None, {"a": A}, {"card": 2}, (), False),
    ("node gone, young reservation: wait", snap(card(0, 96, 8, 2, 1),
                                                reservations=(res("a", (0,), 8, 2, created=NOW - 5),)),
     None, {}, {"card": 1}, (), False),
]


PENDING_A = snap(card(0, 96, 8, 2, 1), reservations=(res("a", (0,), 8, 2, state="pending"),))
PENDING_A_YOUNG = snap(card(0, 96, 8, 2, 1), reservations=(res("a", (0,), 8, 2, "pending", NOW - 100),))


# (id, snapshot, pods held on another node, suspects): a pod binds once, so a pending booking here of a pod held
# elsewhere can never be bound (its binder died before the Binding; kube-scheduler's retry bound it elsewhere)
ELSEWHERE = [
    ("pending, its pod held on another node: a suspect", PENDING_A, {"a"}, ("a",)),
    ("pending, its pod held elsewhere, but younger than the keep window: settling", PENDING_A_YOUNG, {"a"}, ()),
    ("pending, another pod held elsewhere: the janitor's", PENDING_A, {"b"}, ()),
]


@pytest.mark.parametrize(("snapshot", "elsewhere", "suspects"), [c[1:] for c in ELSEWHERE],
                         ids=[c[0] for c in ELSEWHERE])
def test_diff_node_judges_a_pending_booking_of_a_pod_held_elsewhere(snapshot: NodeSnapshot, elsewhere: set[str],
                                                                    suspects: tuple[str, ...]) -> None:
    assert diff_node(N, snapshot, inv(96), {}, NOW, KEEP, elsewhere).suspects == suspects


@pytest.mark.parametrize(("snapshot", "inventory", "holders", "kinds", "suspects", "remove"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_diff_node(snapshot: NodeSnapshot | None, inventory: Inventory | None, holders: dict[str, PodUsage],
                   kinds: dict[str, int], suspects: tuple[str, ...], remove: bool) -> None:
    d = diff_node(N, snapshot, inventory, holders, NOW, KEEP)
    assert summarize(d.differences) == kinds, [x.detail for x in d.differences]
    assert d.suspects == suspects
    assert d.remove is remove
    assert d.clean is (not kinds and not suspects and not remove)


# (id, the bound reservation, the record's usage): the ledger's booking wins, whatever the record says
KEPT = [
    ("record grown after bind (2 units/1 core -> 96/16)", res("a", (0,), 2, 1), use((0,), 96, 16)),
    ("record moved to another card", res("a", (0,), 2, 1), use((1,), 2, 1)),
    ("record on two cards", res("a", (0,), 2, 1), use((0, 1), 2, 1)),
    ("record with more slices", res("a", (0,), 2, 1), use((0,), 2, 1, slices=2)),
    ("young reservation: a record never changes legitimately, at any age", res("a", (0,), 2, 1, created=NOW - 5),
     use((0,), 96, 16)),
]


@pytest.mark.parametrize(("held", "record"), [k[1:] for k in KEPT], ids=[k[0] for k in KEPT])
def test_a_changed_record_does_not_change_a_bound_booking(held: Reservation, record: PodUsage) -> None:
    ledger = snap(card(0, 96, held.mem, held.cores, 1), card(1, 96), reservations=(held,))
    d = diff_node(N, ledger, inv(96, 96), {"a": record}, NOW, KEEP)
    assert d.kept == ("a",)
    assert d.clean, [x.detail for x in d.differences]  # nothing to repair: no replace_node with the record
    # while the same record on a pending reservation is a difference to repair (the record is the truth)
    pending = snap(card(0, 96, held.mem, held.cores, 1), card(1, 96),
                   reservations=(replace(held, state="pending", bound_at=0, created=OLD),))
    d = diff_node(N, pending, inv(96, 96), {"a": record}, NOW, KEEP)
    assert d.kept == () and summarize(d.differences).get("changed_holder") == 1


def test_every_difference_names_what_differs() -> None:
    d = diff_node(N, snap(card(0, 96, 112, 2, 1), reservations=(res("a", (0,), 8, 2),)), inv(96), {"a": A}, NOW,
                  KEEP)
    assert "112" in d.differences[0].detail and "8/2/1" in d.differences[0].detail


def test_offers_cards() -> None:
    assert not offers_cards(None)
    assert not offers_cards(Inventory(N))
    assert offers_cards(inv(96))
    assert offers_cards(inv(error="x"))


def _slice(cards: int = 1, mem: int = 8, cores: int = 2) -> SliceRequest:
    mode = Mode.SLICE if cards == 1 and mem else Mode.MULTI
    return SliceRequest(mode, cards, mem, cores, 1, None, ())


@pytest.mark.parametrize(("request_", "gpu_index", "inventory", "want"), [
    (_slice(), "1", inv(96, 96), use((1,), 8, 2)),
    (_slice(cards=2, mem=0, cores=16), "0,1", inv(160, 160), use((0, 1), 160, 16)),  # whole cards: the model's
    (_slice(), "", inv(96, 96), None),  # nothing survives
    (_slice(), "7", inv(96, 96), None),  # a card the node does not have
    (_slice(), "x", inv(96, 96), None),
    (_slice(cards=2, mem=0, cores=16), "0", inv(96, 96), None),  # fewer cards than it asks
    (_slice(cards=2, mem=0, cores=16), "0,1", inv(96, 160), None),  # cards of two models
    (None, "0", inv(96), None),  # its request cannot be read
    (_slice(), "0", None, None),  # the node is unknown
])
def test_recovered_usage(request_: SliceRequest | None, gpu_index: str, inventory: Inventory | None,
                         want: PodUsage | None) -> None:
    assert recovered_usage(Unrecorded("ns/p", N, request_, gpu_index), inventory) == want


def test_quarantine_reason_names_the_pods() -> None:
    assert quarantine_reason([]) == ""
    why = quarantine_reason(Unrecorded(f"ns/p{i}", N, None, "") for i in range(5))
    assert why.startswith("quarantined: ns/p0, ns/p1, ns/p2 and 2 more") and "no card is offered" in why
