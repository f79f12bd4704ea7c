"""Red team of the preempt verb: its work and its waits are bounded per call, not per node.

kube-scheduler sends at least 100 candidate nodes (MinCandidateNodesAbsolute) to the preempt verb in any
cluster of 100 nodes or more. On a full node (8 cards, 13 slices each: 104 pods, within the kubelet's 110)
a whole-card preemptor made choose_victims try 4096 subsets per card (only all of a card's holders free it,
so every smaller subset was tried first): ~33,000 card-rule checks and ~0.3 s per node, ~30 s for one call,
in the event loop that filter and bind share, and past kube-scheduler's httpTimeout (30 s). The victims'
priorities were read one GET at a time (8 at once) with no deadline: one slow API server held the answer
as long as its reads took (30 s each)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import shared.domain.fit as fit_module
from controller import preempt as preempt_verb
from controller.preempt import Preemption
from shared.domain.preempt import REDUCED, Victim, choose_victims
from shared.domain.state import CardRecord, NodeSnapshot, Reservation
from tests.unit._k8s import VGPU, ctr, pod
from tests.unit._servers import FakeKube, extender
from tests.unit.test_preempt import S4000, node

CANDIDATES = 100  # kube-scheduler's MinCandidateNodesAbsolute: what one preempt call carries at least
CARDS, PER_CARD, UNITS = 8, 13, 7  # a full node: 104 slices of 7 units (91 of a card's 96)
CHECKS_PER_CALL = 200_000  # card-rule checks one call may make, however many nodes it carries


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


@pytest.mark.parametrize(("limits", "fewest"), [
    ({VGPU: 1}, PER_CARD),  # a whole card: all 13 holders of one card (each of them is needed)
    # 32 units where 5 are free: any 4 of a card's 13 slices (1,093 subsets of up to 4 on each card)
    ({VGPU: 1, "mthreads.com/sgpu-memory": 32, "mthreads.com/sgpu-core": 1}, 4),
], ids=["whole-card", "slice"])
async def test_one_call_over_kube_schedulers_candidates_is_bounded_work(
        rule_checks: list[int], limits: dict[str, Any], fewest: int) -> None:
    ext = extender(cfg=S4000)
    names = [f"n{i:03d}" for i in range(CANDIDATES)]
    for n in names:
        ext.mirror.put(full_node(n))
    args = {"Pod": preemptor(limits),
            "NodeNameToMetaVictims": {n: {"Pods": [{"UID": u} for u in sorted(full_node(n).reservations)],
                                          "NumPDBViolations": 0} for n in names}}
    started = time.perf_counter()
    out = await Preemption(ext).preempt(args)
    took = time.perf_counter() - started
    # every node still answered, with victims of one card that free it: the fewest while the budget lasts
    answered = out["NodeNameToMetaVictims"]
    assert len(answered) == CANDIDATES
    for victims in answered.values():
        uids = [v["UID"] for v in victims["Pods"]]
        assert fewest <= len(uids) <= PER_CARD and len({u.rsplit("-", 1)[0] for u in uids}) == 1, uids
    assert len(answered[names[0]]["Pods"]) == fewest
    assert rule_checks[0] <= CHECKS_PER_CALL, f"{rule_checks[0]} card-rule checks in one call ({took:.1f} s)"


def test_a_minimal_subset_found_is_not_thrown_away_at_the_search_bound() -> None:
    # 16 slices of 6 units and 1 core group fill card 0; the preemptor needs 5 core groups: any 5 of them free
    # it. Sizes 0..4 are 2,517 subsets; the first subset of size 5 frees the card, the 4096th ends the search.
    held = [(f"v{j:02d}", (0,), 6, 1, 1) for j in range(16)]
    states, holdings = node(held, cards=1, max_slices=32)
    req_pod = pod(ctr("a", limits={VGPU: 1, "mthreads.com/sgpu-memory": 2, "mthreads.com/sgpu-core": 5}))
    from shared.domain.request import pod_request

    req = pod_request(req_pod, S4000)
    assert req is not None
    choice = choose_victims(states, holdings, [Victim(u, 1) for u, *_ in held], req, {})
    assert len(choice.victims) == 5, f"{len(choice.victims)} victims evicted where 5 free the card"
    assert choice.outcome == REDUCED


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
    bound = getattr(preempt_verb, "LOOKUP_SECONDS", 2.0) + 1.0
    try:
        out = await asyncio.wait_for(Preemption(ext).preempt(args), bound)
    except TimeoutError:
        pytest.fail(f"no answer within {bound:g} s: the victims' reads have no deadline")
    # unread priorities count as the ceiling: the answer is still the card's holders
    assert [p["UID"] for p in out["NodeNameToMetaVictims"]["n000"]["Pods"]] == uids
