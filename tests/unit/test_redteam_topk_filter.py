"""Red team of the top-k filter's early stop (controller/extender.py _filter, controller/fit_memo.py): what
the old filter (fit every node, then top_k over the fitting ones) reported must still be reported."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from typing import Any

import pytest

from controller.extender import Extender
from controller.fit_memo import FitMemo
from shared.domain.fit import fit
from shared.domain.request import pod_request
from shared.domain.state import CardRecord, NodeSnapshot
from shared.domain.topk import top_k
from shared.serving.metrics import TOPK_DROPPED
from tests.unit._servers import CFG, FakeKube, bind_args, extender, pod
from tests.unit.test_topk import fills, random_node, random_pod


def full(index: int) -> CardRecord:
    return CardRecord(index, 96, 96, 0, 16, 16, 0, 1, 16, "ok")


def free(index: int) -> CardRecord:
    return CardRecord(index, 96, 0, 96, 16, 0, 16, 0, 16, "ok")


def cluster(k: int, kube: FakeKube | None = None) -> Extender:
    """n-full: no room; n-err: a snapshot with an error (unresolvable); 'gone' is not in the mirror."""
    ext = extender(dataclasses.replace(CFG, filter_top_k=k), kube=kube)
    ext.mirror.replace_all({})
    ext.mirror.put(NodeSnapshot("n-full", 1, cards={0: full(0), 1: full(1)}))
    ext.mirror.put(NodeSnapshot("n-err", 1, error="bad inventory"))
    return ext


def args(uid: str, names: list[str]) -> dict[str, object]:
    return args_of(pod(uid), names)


def args_of(p: dict[str, Any], names: list[str]) -> dict[str, object]:
    return {"Pod": p, "NodeNames": names}


def dropped() -> float:
    return TOPK_DROPPED._value.get()


def test_no_fit_reports_an_error_node_next_to_an_unregistered_one() -> None:
    """None fits, and the candidates hold both a node whose snapshot has an error and a name the mirror lacks:
    the old filter reported every node; the early stop's second pass (for the unregistered names) replaced
    the unresolvable nodes of the first, so the error node was in neither list."""
    names = ["n-full", "n-err", "gone"]
    want = cluster(0).filter(args("u1", names))
    before = dropped()
    got = cluster(1).filter(args("u1", names))
    assert want["NodeNames"] == [] and set(want["FailedAndUnresolvableNodes"]) == {"n-err", "gone"}
    assert got == want
    assert dropped() == before  # nothing is dropped when no node is returned


def test_no_fit_event_names_every_node() -> None:
    kube = FakeKube()
    for k in (0, 1):
        ext = cluster(k, kube)

        async def run(e: Extender = ext, uid: str = f"u{k}") -> None:
            e.filter(args(uid, ["n-full", "n-err", "gone"]))
            await asyncio.gather(*e._events)

        asyncio.run(run())
    (_, every), (_, early) = kube.events
    assert "n-err" in every and early == every


def test_bind_to_a_node_the_filter_did_not_fit() -> None:
    """k=1 leaves later nodes unfitted (no memo entry); kube-scheduler may still bind there (another replica
    filtered, or a filter from before the node changed): bind fits afresh and books."""
    kube = FakeKube()
    ext = extender(dataclasses.replace(CFG, filter_top_k=1), kube=kube)
    ext.mirror.replace_all({})
    ext.mirror.put(NodeSnapshot("n-a", 1, cards={0: free(0), 1: free(1)}))
    ext.mirror.put(NodeSnapshot("n-b", 1, cards={0: free(0), 1: free(1)}))
    out = ext.filter(args("u1", ["n-a", "n-b"]))
    assert out["NodeNames"] == ["n-a"] and "n-b" not in ext.memo.fits
    ext._unclaim("u1")

    async def run() -> dict[str, object]:
        return await ext.bind(bind_args("u1", "n-b"))

    assert asyncio.run(run()) == {"Error": ""}
    assert kube.bound == [("ns/p-u1", "u1", "n-b")]


def old_filter(ext: Extender, names: list[str], p: dict[str, Any], k: int,
               policy: str) -> tuple[list[str], dict[str, str], dict[str, str], bool]:
    """The filter before the early stop: fit every candidate, then top_k over the fitting ones by fill
    (and whether it cut: then the nodes are best first, else in the candidates' order)."""
    req = pod_request(p, ext.cfg)
    assert req is not None
    memo = FitMemo(ext.mirror, 1 << 30)
    ok, failed, unresolvable = memo.fit_nodes(names, req, {}, ext.cfg.gpu_scheduler_policy, ext.held)
    cut = 0 < k < len(ok)
    if cut:
        ok = top_k(fills(ext.mirror, ok, ext.held), k, policy)
    return ok, {n: r.text for n, r in failed.items()}, unresolvable, cut


@pytest.mark.parametrize("seed", range(30))
def test_early_stop_equals_the_old_filter_with_error_nodes_and_bookings_in_flight(seed: int) -> None:
    """As test_topk's seeded table, plus snapshots with an error (some with cards, so they rank anywhere)
    and bookings in flight (`held`, which change a node's fill and fit), against the old filter itself."""
    rng = random.Random(1000 + seed)
    for case in range(8):
        nodes: dict[str, NodeSnapshot] = {}
        for i in range(rng.randint(1, 10)):
            name, snap = f"n{i:02d}", random_node(rng, f"n{i:02d}", rng.randint(1, 9))
            if rng.random() < 0.2:
                snap = dataclasses.replace(snap, error="inventory mismatch")
            nodes[name] = snap
        names = rng.sample(sorted(nodes), rng.randint(1, len(nodes)))
        names += rng.sample(["gone-a", "gone-b"], rng.randint(0, 2))
        rng.shuffle(names)
        k, policy = rng.randint(1, 4), rng.choice(["binpack", "spread"])
        ext = extender(dataclasses.replace(CFG, filter_top_k=k))
        ext.mirror.replace_all(nodes)
        for name, snap in nodes.items():  # another pod's bind books a card on some nodes right now
            hp = random_pod(rng, f"h-{name}")
            hreq = pod_request(hp, CFG)
            assert hreq is not None
            got_fit = fit(snap.states(), hreq, {}, CFG.gpu_scheduler_policy)
            if not snap.error and got_fit.cards and rng.random() < 0.4:
                ext.held[name] = {f"h-{name}": (hreq, got_fit.cards)}
        p = random_pod(rng, f"u{seed}-{case}")
        p["metadata"]["annotations"] = {"hami.io/node-scheduler-policy": policy}
        want_ok, want_failed, want_unres, cut = old_filter(ext, names, p, k, policy)
        before = dropped()
        out = ext.filter(args_of(p, names))
        if want_ok:
            assert sorted(out["NodeNames"]) == sorted(want_ok), (seed, case)
            if cut:
                assert out["NodeNames"] == want_ok, (seed, case)  # best first
        else:
            assert out["NodeNames"] == [], (seed, case)
            assert out["FailedNodes"] == want_failed, (seed, case)
            assert out["FailedAndUnresolvableNodes"] == want_unres, (seed, case)
            assert dropped() == before, (seed, case)
