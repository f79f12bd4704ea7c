"""Red team: a sidecar (an init container with restartPolicy: Always, Kubernetes' native sidecars) runs
beside the app containers for the pod's whole life. Counting it as an init container that ends before the
apps start books one card for less than the pod holds there at once (memory, cores and slice instances),
and lets a namespace run past its `limits.`/bare quota. Kubernetes' own rule (the pod's effective request):
max(sum(apps) + sum(sidecars), max over init containers i of (i + the sidecars started before i)).
"""

from __future__ import annotations

from typing import Any

import pytest

from shared.domain.admission import decide
from shared.domain.annotations import ALLOCATED, PodUsage, usage_from_annotations
from shared.domain.fit import CardState, fit
from shared.domain.node import Card
from shared.domain.quota import asks_usage
from shared.domain.request import RequestError, pod_request, read_asks
from tests.unit._k8s import CORE, MEM, S4000, VGPU, cfg, ctr, pod, slice_ctr

C = cfg((S4000,))


def sidecar(name: str, memory: int, cores: int) -> dict[str, Any]:
    return {**slice_ctr(name, memory, cores), "restartPolicy": "Always"}


def with_sidecar() -> dict[str, Any]:
    return pod(slice_ctr("app", 32, 6), init=[sidecar("proxy", 32, 6)])


def test_a_sidecar_is_booked_beside_the_app_containers() -> None:
    req = pod_request(with_sidecar(), C)
    assert req is not None
    assert (req.memory, req.cores, req.slices) == (64, 12, 2)


def test_an_init_container_runs_beside_the_sidecars_started_before_it() -> None:
    p = pod(slice_ctr("app", 8, 2), init=[sidecar("proxy", 16, 4), slice_ctr("setup", 64, 8)])
    req = pod_request(p, C)
    assert req is not None
    # setup runs with proxy (80 memory, 12 cores, 2 instances); later app runs with proxy (24, 6, 2)
    assert (req.memory, req.cores, req.slices) == (80, 12, 2)


def test_a_plain_init_container_still_ends_before_the_apps() -> None:
    p = pod(slice_ctr("app", 32, 6), init=[slice_ctr("setup", 32, 6)])
    req = pod_request(p, C)
    assert req is not None
    assert (req.memory, req.cores, req.slices) == (32, 6, 1)


def test_sidecar_and_app_cores_past_a_card_are_refused() -> None:
    with pytest.raises(RequestError, match="sgpu-core in all"):
        pod_request(pod(slice_ctr("app", 8, 10), init=[sidecar("proxy", 8, 10)]), C)


def test_an_exclusive_sidecar_cannot_share_the_card_with_an_exclusive_app() -> None:
    excl = {VGPU: 1}
    with pytest.raises(RequestError, match="exclusive"):
        pod_request(pod(ctr("app", excl), init=[{**ctr("proxy", excl), "restartPolicy": "Always"}]), C)


def test_two_sidecar_pods_do_not_fit_where_the_card_has_room_for_one() -> None:
    req = pod_request(with_sidecar(), C)
    assert req is not None
    card = CardState(Card("n1", 0, S4000, 16), memory_used=64, cores_used=4, slices_used=2)
    assert not fit([card], req, {}, "spread").ok  # 64 used + 64 at once > 96 (the proxy alone would fit)


def test_the_quota_charges_a_sidecar_beside_the_apps() -> None:
    assert asks_usage(read_asks(with_sidecar(), C), C) == {VGPU: 2, MEM: 64, CORE: 12}
    d = decide(with_sidecar(), C, {S4000})  # what the webhook's quota check is handed
    assert d.allowed and dict(d.usage) == {VGPU: 2, MEM: 64, CORE: 12}


def test_a_bound_pods_record_counts_its_sidecar_beside_the_apps() -> None:
    p = with_sidecar()
    p["spec"]["nodeName"] = "n1"
    p["metadata"]["annotations"] = {ALLOCATED: "n1-mthreads-0,Mthreads,16384,6:;n1-mthreads-0,Mthreads,16384,6:;"}
    assert usage_from_annotations(p) == PodUsage("n1", (0,), 64, 12, 2)
