"""Red team (the admission chain): with `reinvocationPolicy: IfNeeded` the API server calls our webhook again
after a later webhook changed the pod, with our own patch already applied. Our answer must be a fixpoint (the
pod we admitted is admitted again as it is, no fill twice, no denial of our own output), the final pod must be
what the extender places, and a container another webhook injected is judged and filled like the user's own.
"""

from __future__ import annotations

from typing import Any

import pytest

from shared.config import load_config
from shared.domain.admission import decide, placement_request
from shared.domain.patch import apply_patch

CFG = load_config(env={}, flags={"memoryPerCard": "96,160"})
VGPU, MEM, CORE = "mthreads.com/vgpu", "mthreads.com/sgpu-memory", "mthreads.com/sgpu-core"


def pod(*containers: dict[str, Any], init: list[dict[str, Any]] | None = None,
        annotations: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = init
    return {"metadata": {"name": "p", "namespace": "ns", "annotations": dict(annotations or {})}, "spec": spec}


def c(name: str, limits: dict[str, str] | None = None, requests: dict[str, str] | None = None,
      **extra: Any) -> dict[str, Any]:
    res: dict[str, Any] = {}
    if limits is not None:
        res["limits"] = limits
    if requests is not None:
        res["requests"] = requests
    return {"name": name, "image": "busybox", "resources": res, **extra}


PODS = {
    "slice": pod(c("a", {VGPU: "1", MEM: "32", CORE: "4"})),
    "slice, cores filled": pod(c("a", {VGPU: "1", MEM: "8"})),
    "exclusive": pod(c("a", {VGPU: "1"})),
    "exclusive pinned": pod(c("a", {VGPU: "1"}), annotations={"mtsched.io/card-memory": "S4000"}),
    "multi": pod(c("a", {VGPU: "2"})),
    "vgpu under requests only": pod(c("a", requests={VGPU: "1", MEM: "16", CORE: "2"},
                                      limits={MEM: "16", CORE: "2"})),
    "init and sidecar": pod(c("a", {VGPU: "1", MEM: "16"}), init=[
        c("i", {VGPU: "1", MEM: "32"}), c("s", {VGPU: "1", MEM: "4"}, restartPolicy="Always")]),
}


@pytest.mark.parametrize("case", PODS)
def test_our_answer_is_a_fixpoint_when_called_again(case: str) -> None:
    first = decide(PODS[case], CFG, reported=(96, 160))
    assert first.allowed, first.message
    admitted = apply_patch(PODS[case], first.patch)
    again = decide(admitted, CFG, reported=(96, 160))
    assert again.allowed, again.message
    assert apply_patch(admitted, again.patch) == admitted, again.patch
    assert again.usage == first.usage
    assert placement_request(admitted, CFG) is not None  # and the extender places what we admitted


def test_an_injected_container_is_judged_when_we_are_called_again() -> None:
    admitted = apply_patch(PODS["slice"], decide(PODS["slice"], CFG, reported=(96, 160)).patch)
    # a sidecar injector adds a container holding a slice of its own, without cores: filled, and the pod's
    # peak now counts it
    injected = {**admitted, "spec": {**admitted["spec"], "containers": [
        *admitted["spec"]["containers"], c("proxy", {VGPU: "1", MEM: "4"})]}}
    again = decide(injected, CFG, reported=(96, 160))
    assert again.allowed
    assert apply_patch(injected, again.patch)["spec"]["containers"][1]["resources"]["limits"][CORE] == "1"
    # an injected exclusive container beside the slice: refused at creation, with the rule
    injected["spec"]["containers"][1] = c("proxy", {VGPU: "1"})
    again = decide(injected, CFG, reported=(96, 160))
    assert not again.allowed and "exclusive containers (only mthreads.com/vgpu: 1: proxy)" in again.message
    # an injected privileged container holding the slice
    injected["spec"]["containers"][1] = c("proxy", {VGPU: "1", MEM: "4"}, securityContext={"privileged": True})
    again = decide(injected, CFG, reported=(96, 160))
    assert not again.allowed and 'container "proxy" is privileged' in again.message
