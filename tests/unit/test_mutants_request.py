"""Rules of what a pod asks that no other test pinned down (red team, mutants).

Each case names the small bug it guards against: with the bug in shared/domain/request.py the case fails.
"""

from __future__ import annotations

import pytest

from shared.domain.request import RequestError, pod_request
from tests.unit._k8s import VGPU, cfg, ctr, pod

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
