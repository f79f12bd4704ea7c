"""Rules of what a pod asks that no other test pinned down (red team, mutants).

Each case names the small bug it guards against: with the bug in shared/domain/request.py the case fails.
"""

from __future__ import annotations

import pytest

from shared.domain.request import RequestError, pod_request
from tests.unit._k8s import CORE, MEM, VGPU, cfg, ctr, pod

MIXED = cfg((96, 160))


def refusal(p: dict[str, object]) -> str:
    with pytest.raises(RequestError) as e:
        pod_request(p, MIXED)
    return str(e.value)


# mutant: "only one app container may ask vgpu=n" counts app containers only, not sidecars, which run beside them
def test_a_multi_card_sidecar_is_a_second_app_container() -> None:
    sidecar = ctr("side", limits={VGPU: 2}, restartPolicy="Always")
    assert "only one app container may ask mthreads.com/vgpu=2" in refusal(
        pod(ctr("a", limits={VGPU: 2}), init=[sidecar]))
    # a plain init container runs before the app and shares its cards: allowed
    req = pod_request(pod(ctr("a", limits={VGPU: 2}), init=[ctr("i", limits={VGPU: 2})]), MIXED)
    assert req is not None and req.cards == 2


# mutant: the largest sgpu-memory a pod may ask is bounded by the smallest configured model, not the largest: a
# 40-card S5000 pod (6400 units) would be refused as "too large" on a fleet that also has S4000s (96 x 64 = 6144)
def test_the_memory_bound_is_the_largest_model_times_the_most_cards() -> None:
    req = pod_request(pod(ctr("a", limits={VGPU: 40, MEM: 40 * 160, CORE: 40 * 16})), MIXED)
    assert req is not None and req.cards == 40 and req.model == 160
    assert "is too large; at most 10240" in refusal(pod(ctr("a", limits={VGPU: 1, MEM: 64 * 160 + 1})))
