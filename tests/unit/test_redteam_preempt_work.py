"""Red team of the preempt verb: its work and its waits are bounded per call, not per node.

kube-scheduler sends up to max(100, 10% of the nodes) candidate nodes (MinCandidateNodesAbsolute) to the verb in a
cluster of 100 nodes or more. On a full node (8 cards, 13 slices each: 104 pods, within the kubelet's 110)
a whole-card preemptor made the old subset search try 4096 subsets per card (only all of a card's holders
free it, so every smaller subset was tried first): ~33,000 card-rule checks and ~0.3 s per node, 36 s for one
call, in the event loop that filter and bind share, and past kube-scheduler's httpTimeout (30 s); a slice
preemptor, 12 s. The search also threw away the fewest victims it had found when it reached its bound (16
evicted where 5 freed the card), and the victims' priorities were read one GET at a time (8 at once) with no
deadline: a slow API server held the answer as long as its reads took (30 s each). The answer is now the
whole proposal or nothing (tests/unit/test_redteam_preempt_reprieve.py): a few checks per card, no reads."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import shared.domain.fit as fit_module
from controller.preempt import Preemption
from shared.domain.state import CardRecord, NodeSnapshot, Reservation
from tests.unit._k8s import VGPU, ctr, pod
from tests.unit._servers import FakeKube, extender
from tests.unit.test_preempt import S4000

CANDIDATES = 100  # kube-scheduler's MinCandidateNodesAbsolute: what one preempt call carries at least
CARDS, PER_CARD, UNITS = 8, 13, 7  # a full node: 104 slices of 7 units (91 of a card's 96)
CHECKS_PER_CALL = 10 * CARDS * CANDIDATES  # card-rule checks one call may make: a few per card


def full_node(name: str) -> NodeSnapshot:
    res = {f"{name}-{c}-{j}": Reservation(f"{name}-{c}-{j}", (c,), UNITS, 1, 1, "bound", 1,
                                          pod=f"ns/{name}-{c}-{j}")
           for c in range(CARDS) for j in range(PER_CARD)}
    used = PER_CARD * UNITS
    cards = {c: CardRecord(c, 96, used, 96 - used, 16, PER_CARD, 16 - PER_CARD, PER_CARD, 16, "ok")
             for c in range(CARDS)}
    return NodeSnapshot(name, 1, cards=cards, reservations=res)


def preemptor(limits: dict[str, Any]) -> dict[str, Any]:
    p = pod(ctr("a", limits=limits))
    p["metadata"].update(name="hi", namespace="ns", uid="hi")
    p["spec"].update(schedulerName="hami-scheduler", priority=1000)
    return p


def whole_card_preemptor() -> dict[str, Any]:
    return preemptor({VGPU: 1})


@pytest.fixture
def rule_checks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    real = fit_module.card_rule

    def counted(c: Any, n: Any) -> str:
        calls[0] += 1
        return real(c, n)

    monkeypatch.setattr(fit_module, "card_rule", counted)
    return calls


@pytest.mark.parametrize("limits", [
    {VGPU: 1},  # a whole card: all 13 holders of a card free it
    {VGPU: 1, "mthreads.com/sgpu-memory": 32, "mthreads.com/sgpu-core": 1},  # any 4 of a card's 13 would
], ids=["whole-card", "slice"])
async def test_one_call_over_kube_schedulers_candidates_is_bounded_work(
        rule_checks: list[int], limits: dict[str, Any]) -> None:
    ext = extender(cfg=S4000)
    names = [f"n{i:03d}" for i in range(CANDIDATES)]
    for n in names:
        ext.mirror.put(full_node(n))
    proposal = {n: [{"UID": u} for u in sorted(full_node(n).reservations)] for n in names}
    args = {"Pod": preemptor(limits),
            "NodeNameToMetaVictims": {n: {"Pods": proposal[n], "NumPDBViolations": 0} for n in names}}
    started = time.perf_counter()
    out = await Preemption(ext).preempt(args)
    took = time.perf_counter() - started
    # every node answered with kube-scheduler's proposal: it frees a card there
    assert {n: v["Pods"] for n, v in out["NodeNameToMetaVictims"].items()} == proposal
    assert rule_checks[0] <= CHECKS_PER_CALL, f"{rule_checks[0]} card-rule checks in one call ({took:.1f} s)"


class SlowKube(FakeKube):
    """An API server that answers pod reads after `delay` seconds (overloaded, or a partition)."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    async def get_pod(self, ns: str, name: str) -> dict[str, Any]:
        await asyncio.sleep(self.delay)
        return await super().get_pod(ns, name)


async def test_a_slow_api_server_does_not_hold_the_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    kube = SlowKube(delay=30.0)  # the Kube client's own timeout per read
    ext = extender(cfg=S4000, kube=kube)
    ext.mirror.put(full_node("n000"))
    uids = sorted(full_node("n000").reservations)[:PER_CARD]  # card 0's holders
    args = {"Pod": whole_card_preemptor(),
            "NodeNameToMetaVictims": {"n000": {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": 0}}}
    bound = 1.0
    try:
        out = await asyncio.wait_for(Preemption(ext).preempt(args), bound)
    except TimeoutError:
        pytest.fail(f"no answer within {bound:g} s: the verb waits for the API server")
    # the answer is the card's holders, as proposed
    assert [p["UID"] for p in out["NodeNameToMetaVictims"]["n000"]["Pods"]] == uids
