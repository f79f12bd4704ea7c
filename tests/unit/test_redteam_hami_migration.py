"""Red team (migrating from HAMi v2.10): what the webhook does, on its first install, with the pods HAMi's users
create. HAMi's three mthreads examples (examples/mthreads: a slice, a multi-card pod, an exclusive pod) are admitted
as HAMi admits them; a HAMi annotation this scheduler does not read is said, not ignored without a word."""

from __future__ import annotations

import pytest

from shared.domain.admission import decide
from tests.unit._k8s import CORE, MEM, S4000, VGPU, cfg, ctr, pod

SCORING_WEIGHTS = "hami.io/device-scoring-weights"  # HAMi v2.10 pkg/util/types.go
CFG = cfg()


@pytest.mark.parametrize(("limits", "filled"), [
    ({VGPU: 1, MEM: 32, CORE: 8}, {}),  # default_use.yaml
    ({VGPU: 2}, {MEM: "192", CORE: "32"}),  # multi_cards.yaml: HAMi's fills
    ({VGPU: 1}, {MEM: "96", CORE: "16"}),  # use_exclusive.yaml
])
def test_hamis_mthreads_examples_are_admitted(limits: dict[str, object], filled: dict[str, str]) -> None:
    d = decide(pod(ctr("gpushare-pod-1", limits=limits), restartPolicy="OnFailure"), CFG, reported=(S4000,))
    assert d.allowed, d.message
    got = {op["path"].rsplit("/", 1)[1].replace("~1", "/"): op["value"] for op in d.patch
           if "/resources/limits/" in op["path"]}
    assert got == filled
    assert {"op": "add", "path": "/spec/schedulerName", "value": "hami-scheduler"} in d.patch


def test_hamis_device_scoring_weights_are_said_to_be_unread() -> None:
    """HAMi v2.10 orders a pod's candidate cards by `hami.io/device-scoring-weights` (pkg/util/types.go
    DeviceScoringWeightsAnnotationKey); this scheduler scores cards with equal weights. A pod carried over from
    HAMi with its own weights was admitted and placed by other weights than its owner chose, without a word."""
    p = pod(ctr(limits={VGPU: 1, MEM: 32, CORE: 8}), annotations={SCORING_WEIGHTS: "slot=1,core=1,memory=3"})
    d = decide(p, CFG, reported=(S4000,))
    assert d.allowed
    assert any(SCORING_WEIGHTS in w and "not read" in w for w in d.warnings), d.warnings
    # a pod that asks for no slice is not ours to comment on
    cpu = decide(pod(ctr(limits={"cpu": "1"}), annotations={SCORING_WEIGHTS: "slot=1,core=1,memory=3"}), CFG)
    assert cpu.allowed and not cpu.warnings


def test_a_record_naming_cards_gpu_index_lacks_makes_the_pod_unrecoverable() -> None:
    """gpu-index lists the last container's cards; HAMi v2.10 may put an init container on another card. A record
    our trust or our decoder sets aside but that names such a card makes the pod's usage unrecoverable from
    gpu-index (its node stays closed) rather than recovered on the app's card alone."""
    from controller.pod_watch import unaccounted

    def hami(gpu_index: str) -> dict[str, object]:
        p = pod(ctr(limits={VGPU: 1, MEM: 16, CORE: 2}), init=[ctr("proxy", limits={VGPU: 1, MEM: 32, CORE: 4},
                                                                    restartPolicy="Always")],
                annotations={"hami.io/mthreads-vgpu-devices-allocated":
                             "g1-mthreads-0,Mthreads,16384,4:;g1-mthreads-1,Mthreads,8192,2:;",
                             "mthreads.com/gpu-index": gpu_index},
                schedulerName="hami-scheduler", nodeName="g1")
        return p

    other = cfg(scheduler_name="mtsched")
    u = unaccounted(hami("1"), other)
    assert u is not None and u.gpu_index == "unreadable"
    u = unaccounted(hami("1,0"), other)  # every card the record names is listed: recovered as before
    assert u is not None and u.gpu_index == "1,0"
