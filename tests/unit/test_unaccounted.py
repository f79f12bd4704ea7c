"""Which bound pods without a readable record close their node (controller/pod_watch.py unaccounted): only those
that name one of our slice resources, also when something else about them cannot be read. A red team closed any
GPU node to every slice pod with a tenant's CPU pod carrying a bad card pin (tests/e2e/test_redteam_card_pin.py)."""

from __future__ import annotations

from typing import Any

import pytest

from controller.pod_watch import unaccounted
from shared.domain.request import PIN_ANNOTATION
from shared.domain.trust import asks_slices
from tests.unit._k8s import CORE, GPU, MEM, VGPU, cfg, ctr, pod, slice_ctr

CFG = cfg()


def bound(p: dict[str, Any]) -> dict[str, Any]:
    p["spec"]["nodeName"] = "gpu-1"
    return p


CPU = ctr(limits={"cpu": "100m"})


@pytest.mark.parametrize(("p", "closes"), [
    (bound(pod(CPU)), False),
    (bound(pod(CPU, annotations={PIN_ANNOTATION: "nope"})), False),  # the red team's: a pin no model has
    (bound(pod(*[ctr(f"c{i}", limits={"cpu": "1m"}) for i in range(1100)])), False),  # past the shape limit
    (bound(pod(ctr(limits={GPU: 1}))), False),  # whole cards: the vendor plugin's, outside the ledger
    (bound(pod(slice_ctr())), True),  # asks, no record
    (bound(pod(slice_ctr(), annotations={PIN_ANNOTATION: "nope"})), True),  # asks, unreadable: fail closed
    (bound(pod(CPU, init=[ctr("i", requests={MEM: 8})])), True),  # an init container's request counts
    (bound(pod(ctr(limits={VGPU: 1, CORE: 2, MEM: "x"}))), True),  # asks, a value that does not parse
])
def test_only_a_pod_naming_our_resources_closes_its_node(p: dict[str, Any], closes: bool) -> None:
    assert asks_slices(p, CFG) is closes
    got = unaccounted(p, CFG)
    assert (got is not None) is closes, got
    if got is not None:
        assert got.node == "gpu-1"


@pytest.mark.parametrize("pin", [None, "nope", "160", "96", "S5000"])
def test_what_a_placed_pod_holds_does_not_read_its_pin(pin: str | None) -> None:
    """Its owner may change the pin after the bind (no admission judges a pod UPDATE): a pin naming no model, or a
    model the slice does not fit, made the request unreadable and closed the node
    (tests/e2e/test_redteam_card_pin.py)."""
    got = unaccounted(bound(pod(slice_ctr(), annotations=None if pin is None else {PIN_ANNOTATION: pin})), CFG)
    assert got is not None and got.request is not None
    assert (got.request.cards, got.request.memory, got.request.cores, got.request.slices) == (1, 32, 8, 1)
