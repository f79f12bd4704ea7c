"""The filter's top k (shared/domain/topk.py) and the bookings in flight it counts (controller/fit_memo.py)."""

from __future__ import annotations

import dataclasses
import random

import pytest

from controller.extender import Extender
from controller.fit_memo import NO_HELD, Held, held_states
from shared.domain.fit import EXCLUSIVE_CONFLICT, node_score
from shared.domain.models import union_memory_values
from shared.domain.request import SliceRequest, pod_request
from shared.domain.state import CardRecord, NodeSnapshot, Reservation
from shared.domain.topk import top_k
from shared.store.mirror import Mirror
from tests.unit._servers import CFG, CORE, MEM, VGPU, FakeKube, bind_args, extender, pod

FILLS = [("n-b", 5.0), ("n-a", 5.0), ("n-c", 12.5), ("n-d", 0.0), ("n-e", 30.0)]


@pytest.mark.parametrize(("fills", "k", "policy", "want"), [
    (FILLS, 0, "binpack", ["n-b", "n-a", "n-c", "n-d", "n-e"]),  # 0: all, in the caller's order
    (FILLS, 1, "binpack", ["n-e"]),  # the fullest
    (FILLS, 3, "binpack", ["n-e", "n-c", "n-a"]),  # ties by name: n-a before n-b
    (FILLS, 1, "spread", ["n-d"]),  # the emptiest
    (FILLS, 3, "spread", ["n-d", "n-a", "n-b"]),
    (FILLS, 9, "binpack", ["n-e", "n-c", "n-a", "n-b", "n-d"]),  # k above the count: all, best first
    ([], 2, "binpack", []),
    ([("x", 1.0)], 1, "spread", ["x"]),
])
def test_top_k_table(fills: list[tuple[str, float]], k: int, policy: str, want: list[str]) -> None:
    assert top_k(fills, k, policy) == want


def fills(mirror: Mirror, names: list[str], held: Held = NO_HELD) -> list[tuple[str, float]]:
    """(node, card fill) of the candidates the mirror holds, bookings in flight applied: what the filter
    ordered per call before it kept a standing order (controller/ranking.py); the reference to check it by."""
    return [(n, node_score(held_states(mirror.nodes[n], held[n])) if n in held else mirror.nodes[n].fill)
            for n in names if n in mirror.nodes]


def used(index: int, capacity: int, mem: int, cores: int, slices: int) -> CardRecord:
    return CardRecord(index, capacity, mem, capacity - mem, 16, cores, 16 - cores, slices, 16, "ok")


def four_nodes(k: int) -> Extender:
    """Nodes n0..n3 of two 96-unit cards, n_i with i slices of 16 units / 4 cores on card 0."""
    ext = extender(dataclasses.replace(CFG, filter_top_k=k), nodes={f"n{i}": 96 for i in range(4)})
    for i in range(4):
        ext.mirror.put(NodeSnapshot(f"n{i}", 1, cards={0: used(0, 96, 16 * i, 4 * i, i),
                                                       1: used(1, 96, 0, 0, 0)}))
    return ext


def args(p: dict[str, object], names: list[str]) -> dict[str, object]:
    return {"Pod": p, "NodeNames": names}


@pytest.mark.parametrize(("k", "policy", "want"), [
    (0, "binpack", ["n0", "n1", "n2", "n3"]),
    (1, "binpack", ["n3"]),
    (2, "binpack", ["n3", "n2"]),
    (1, "spread", ["n0"]),
    (2, "spread", ["n0", "n1"]),
])
def test_filter_returns_the_best_k_and_reports_no_dropped_node_as_failed(k: int, policy: str,
                                                                         want: list[str]) -> None:
    ext = four_nodes(k)
    p = pod("u1")
    p["metadata"]["annotations"] = {"hami.io/node-scheduler-policy": policy}  # type: ignore[index]
    out = ext.filter(args(p, ["n0", "n1", "n2", "n3"]))
    assert out["NodeNames"] == want
    assert out["FailedNodes"] == {} and out["FailedAndUnresolvableNodes"] == {}  # dropped: in neither list


def test_filter_top_k_reports_failed_nodes_only_when_none_fits() -> None:
    """With a node returned, kube-scheduler never reads the failed nodes' statuses: none are sent. With none,
    every node is reported with its reasons (the "0/N nodes are available" message, preemption)."""
    ext, everything = four_nodes(1), four_nodes(0)
    for e in (ext, everything):
        e.mirror.put(NodeSnapshot("n3", 2, cards={0: used(0, 96, 96, 16, 1), 1: used(1, 96, 96, 16, 1)}))
    out = ext.filter(args(pod("u1"), ["n0", "n1", "n2", "n3"]))
    assert out["NodeNames"] == ["n2"] and out["FailedNodes"] == {}
    out = ext.filter(args(pod("u2"), ["n3"]))
    assert out["NodeNames"] == [] and "CardInsufficientMemory" in out["FailedNodes"]["n3"]
    assert everything.filter(args(pod("u3"), ["n2", "n3"]))["FailedNodes"] == {"n3": out["FailedNodes"]["n3"]}


def test_a_booking_in_flight_counts_in_filter_and_prioritize() -> None:
    """While bind books a card (not yet in the mirror), another pod's filter does not count it as free."""
    ext = four_nodes(0)
    whole = pod("u2", limits={VGPU: "1"})  # an exclusive card: needs an idle one
    req = pod_request(whole, ext.cfg)
    assert isinstance(req, SliceRequest)
    assert "n0" in ext.filter(args(whole, ["n0"]))["NodeNames"]
    ext.held["n0"] = {"a": (req, (0,)), "b": (req, (1,))}  # two exclusive bookings in flight on n0
    out = ext.filter(args(pod("u3", limits={VGPU: "1"}), ["n0", "n1"]))
    assert out["NodeNames"] == ["n1"]
    assert EXCLUSIVE_CONFLICT in out["FailedNodes"]["n0"]  # k=0: failed nodes are reported as before
    (score,) = ext.prioritize(args(pod("u4"), ["n0"]))
    assert score["Score"] == 7  # binpack: both cards full (slots 2/32, cores 32/32, memory 192/192)
    ext.mirror.put(dataclasses.replace(ext.mirror.nodes["n0"], version=2))  # a new seq
    ext.held.clear()
    assert ext.filter(args(pod("u5", limits={VGPU: "1"}), ["n0"]))["NodeNames"] == ["n0"]


def test_with_one_node_returned_the_pod_claims_its_card_until_bind() -> None:
    """k=1: kube-scheduler has one candidate and schedules the next pod before the bind arrives; the claim
    keeps that next pod off the card, and a pod's own claim never counts against it."""
    ext = four_nodes(1)
    exclusive = [pod(u, limits={VGPU: "1"}) for u in ("u1", "u2")]
    nodes = ["n0", "n1", "n2", "n3"]
    assert ext.filter(args(exclusive[0], nodes))["NodeNames"] == ["n3"]  # the fullest with an idle card
    assert ext.filter(args(exclusive[0], nodes))["NodeNames"] == ["n3"]  # filtered again: its claim is its own
    assert ext.filter(args(exclusive[1], nodes))["NodeNames"] == ["n2"]
    second = ext.filter(args(exclusive[1], ["n3"]))  # alone: n3 fails, card 1 claimed by u1
    assert second["NodeNames"] == [] and EXCLUSIVE_CONFLICT in second["FailedNodes"]["n3"]
    ext._unclaim("u1")  # bind takes the claim over (or it lapses after CLAIM_SECONDS)
    ext._unclaim("u2")
    assert ext.held == {}
    assert ext.filter(args(exclusive[1], nodes))["NodeNames"] == ["n3"]


@pytest.mark.parametrize("raw", ["-1", "10001", "two"])
def test_filter_top_k_out_of_range_stops_start_up(raw: str) -> None:
    from shared.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="filterTopK"):
        load_config(env={}, flags={"filterTopK": raw})


async def test_a_booking_the_mirror_lacks_stays_held_until_the_feed_brings_it() -> None:
    """The reserve reply brought no message the mirror could apply (here: none at all): the booking keeps
    counting on its node until the mirror holds the reservation, then the hold is dropped."""
    ext = extender(dataclasses.replace(CFG, filter_top_k=0), kube=FakeKube(), nodes={"n0": 96})
    whole = pod("u1", limits={VGPU: "1"})
    req = pod_request(whole, ext.cfg)
    ext.filter(args(whole, ["n0"]))
    assert (await ext.bind(bind_args("u1", "n0")))["Error"] == ""  # FakeLedger books card 0
    assert ext.held == {"n0": {"u1": (req, (0,))}}
    # card 0 counts as taken: u2 gets card 1 (and, the only node returned, claims it until its bind)
    assert ext.filter(args(pod("u2", limits={VGPU: "1"}), ["n0"]))["NodeNames"] == ["n0"]
    assert ext.held == {"n0": {"u1": (req, (0,)), "u2": (req, (1,))}}
    out = ext.filter(args(pod("u3", limits={VGPU: "1"}), ["n0"]))
    assert out["NodeNames"] == [] and EXCLUSIVE_CONFLICT in out["FailedNodes"]["n0"]
    snap = ext.mirror.nodes["n0"]  # the feed arrives: u1's reservation is in the mirror
    ext.mirror.put(dataclasses.replace(snap, version=2, cards={0: used(0, 96, 96, 16, 1), 1: snap.cards[1]},
                                       reservations={"u1": Reservation("u1", (0,), 96, 16, 1, "bound", 0)}))
    out = ext.filter(args(pod("u3", limits={VGPU: "1"}), ["n0"]))
    assert out["NodeNames"] == [] and ext.held == {"n0": {"u2": (req, (1,))}}  # u1's hold dropped, u2 claims
    ext._unclaim("u2")  # its bind (or CLAIM_SECONDS)
    assert ext.filter(args(pod("u3", limits={VGPU: "1"}), ["n0"]))["NodeNames"] == ["n0"]


def random_node(rng: random.Random, name: str, version: int) -> NodeSnapshot:
    cards = {}
    for i in range(2):
        cap = rng.choice([96, 160])
        mem, cores, slices = (0, 0, 0) if rng.random() < 0.3 else (rng.randint(0, cap), rng.randint(0, 16),
                                                                   rng.randint(1, 4))
        cards[i] = used(i, cap, mem, cores, slices)
    return NodeSnapshot(name, version, cards=cards)


def random_pod(rng: random.Random, uid: str) -> dict[str, object]:
    if rng.random() < 0.2:
        return pod(uid, limits={VGPU: "1"})  # exclusive: needs an idle card
    # a value some configured model accepts (the extender refuses any other before fitting: placement_request)
    memory = rng.choice([v for v in union_memory_values(CFG.models) if v <= 96])
    return pod(uid, limits={VGPU: "1", MEM: str(memory), CORE: str(rng.randint(1, 16))})


@pytest.mark.parametrize("seed", range(40))
def test_the_filters_early_stop_returns_what_top_k_over_every_fitting_node_returns(seed: int) -> None:
    """The filter fits nodes best first and stops at the k-th that fits; the nodes (and, when none fits, the
    reasons) must be those of fitting every node and taking top_k, for random nodes, pods, policies and k,
    with names the mirror lacks among the candidates."""
    rng = random.Random(seed)
    for case in range(10):
        nodes = {f"n{i:02d}": random_node(rng, f"n{i:02d}", rng.randint(1, 9)) for i in range(rng.randint(1, 12))}
        names = rng.sample(sorted(nodes), rng.randint(1, len(nodes)))
        names += rng.sample(["gone-a", "gone-b"], rng.randint(0, 2))  # names the mirror lacks
        rng.shuffle(names)
        k, policy = rng.randint(1, 5), rng.choice(["binpack", "spread"])
        p = random_pod(rng, f"u{seed}-{case}")
        p["metadata"]["annotations"] = {"hami.io/node-scheduler-policy": policy}  # type: ignore[index]
        every, early = (extender(dataclasses.replace(CFG, filter_top_k=kk)) for kk in (0, k))
        for e in (every, early):
            e.mirror.replace_all(nodes)
        want = every.filter(args(p, names))
        got = early.filter(args(p, names))
        if len(want["NodeNames"]) <= k:  # all fit nodes, in whichever order (kube-scheduler scores them)
            assert sorted(got["NodeNames"]) == sorted(want["NodeNames"]), (seed, case)
            if not want["NodeNames"]:
                assert got == want, (seed, case)  # and the same reasons for every node
        else:
            assert got["NodeNames"] == top_k(fills(every.mirror, want["NodeNames"]), k, policy), (seed, case)


@pytest.mark.parametrize("seed", range(20))
def test_a_claim_holds_the_cards_a_fresh_fit_gives_whatever_else_is_in_flight(seed: int) -> None:
    """k=1: the claim takes the filter's memoized fit when nothing else is in flight on the node, and fits
    anew around what is; either way the cards a fit of the node as it stands (claims applied) gives."""
    from shared.domain.fit import fit

    rng = random.Random(seed)
    nodes = {f"n{i}": random_node(rng, f"n{i}", 1) for i in range(3)}
    ext = extender(dataclasses.replace(CFG, filter_top_k=1))
    ext.mirror.replace_all(nodes)
    for i in range(12):
        p = random_pod(rng, f"u{i}")
        uid = f"u{i}"
        before = {n: dict(h) for n, h in ext.held.items()}
        out = ext.filter(args(p, sorted(nodes)))
        if not out["NodeNames"]:
            continue
        node = out["NodeNames"][0]
        req = pod_request(p, ext.cfg)
        assert req is not None
        want = fit(held_states(nodes[node], before.get(node, {})), req, {}, ext.cfg.gpu_scheduler_policy)
        assert ext.held[node][uid] == (req, want.cards), (seed, i)
