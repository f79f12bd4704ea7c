"""Red team: the preempt verb's work per node is bounded. kube-scheduler proposes the victims of a node it
finds worth preempting; on a node of many cards a multi-card preemptor once made choose_victims try every set
of `req.cards` freeable cards (C(40, 20) ~ 1.4e11 fit() calls), in the extender's event loop, so filter and
bind stalled with it. The answer is now the whole proposal or nothing: two fits per node."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

import shared.domain.preempt as preempt
from shared.domain.fit import CardState, FitResult
from shared.domain.preempt import KEPT, choose_victims
from tests.unit.test_preempt import node, whole

CALLS_ALLOWED = 2  # as things are, then with the proposal's holders gone


@pytest.fixture
def counted_fit(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    real = preempt.fit

    def fit(states: Sequence[CardState], req: Any, annotations: Mapping[str, str], policy: str = "spread") -> FitResult:
        calls[0] += 1
        if calls[0] > CALLS_ALLOWED:
            raise AssertionError(f"choose_victims called fit() more than {CALLS_ALLOWED} times")
        return real(states, req, annotations, policy)

    monkeypatch.setattr(preempt, "fit", fit)
    return calls


def test_a_many_card_node_is_judged_in_two_fits(counted_fit: list[int]) -> None:
    # 40 cards, each held by one pod, all proposed: they free the 10 cards a 10-card pod needs
    held = [(f"p{i}", (i,), 8, 2, 1 if i >= 30 else 100) for i in range(40)]
    states, holdings = node(held, cards=40)
    choice = choose_victims(states, holdings, [uid for uid, *_ in held], whole(10), {})
    assert choice.outcome == KEPT and len(choice.cards) == 10
    assert choice.victims == tuple(f"p{i}" for i in range(40))
