"""Red team: a pod the webhook admits is placed, recorded and charged as one request, whatever mix of init
containers, sidecars (restartPolicy Always) and app containers asks which of the three resources, under limits,
under requests or both.

Four readers of one pod must agree: the webhook's decision (its patch and the quota charge `usage`), the
extender's `placement_request` on the patched pod, the record the bind writes from the fit, and the watchers'
`usage_from_annotations` of that record. A pod admitted but refused by placement would stay Pending for good; a
record that decodes to other amounts than the bind booked would be re-booked by the watchers (a drift); a charge
other than the booking would let a namespace hold more than its quota. The existing properties
(tests/unit/test_properties.py) start from pods already in their admitted form with at most one init container;
these start from what a user writes and go through `decide`.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from shared.domain.admission import decide, placement_request
from shared.domain.annotations import (
    ALLOCATED,
    CardGrant,
    PodUsage,
    device_id,
    encode_allocation,
    usage_from_annotations,
)
from shared.domain.fit import CardState, fit
from shared.domain.node import Card
from tests.unit._k8s import CORE, MEM, VGPU, apply_patch, cfg

MIXED = cfg((96, 160))
VALUES = {VGPU: ["1", "1", "1", "2", "3"], MEM: ["2", "8", "32", "64", "96", "128", "160", "192", "320"],
          CORE: ["1", "4", "8", "16", "32", "48"]}


@st.composite
def container(draw: st.DrawFn, name: str, init: bool) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "busybox"}
    limits: dict[str, str] = {}
    requests: dict[str, str] = {}
    for resource in (VGPU, MEM, CORE):
        where = draw(st.sampled_from(["none", "none", "limits", "limits", "requests", "both"]))
        if where == "none":
            continue
        value = draw(st.sampled_from(VALUES[resource]))
        if where in ("limits", "both"):
            limits[resource] = value
        if where in ("requests", "both"):
            requests[resource] = value
    res: dict[str, Any] = {}
    if limits:
        res["limits"] = limits
    if requests:
        res["requests"] = requests
    if res:
        c["resources"] = res
    if init and draw(st.booleans()):
        c["restartPolicy"] = "Always"  # a sidecar
    return c


@st.composite
def written_pods(draw: st.DrawFn) -> dict[str, Any]:
    inits = [draw(container(f"i{i}", True)) for i in range(draw(st.integers(0, 2)))]
    apps = [draw(container(f"a{i}", False)) for i in range(draw(st.integers(1, 3)))]
    spec: dict[str, Any] = {"containers": apps}
    if inits:
        spec["initContainers"] = inits
    meta: dict[str, Any] = {"name": "p", "namespace": "ns", "uid": "u1"}
    pin = draw(st.sampled_from([None, None, None, "96", "160"]))
    if pin:
        meta["annotations"] = {"mtsched.io/card-memory": pin}
    return {"metadata": meta, "spec": spec}


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                            HealthCheck.filter_too_much])


@SETTINGS
@given(p=written_pods(), model=st.sampled_from([96, 160]), n=st.integers(1, 8))
def test_an_admitted_pod_is_placed_recorded_and_charged_as_booked(p: dict[str, Any], model: int, n: int) -> None:
    d = decide(p, MIXED, (96, 160))
    assume(d.allowed)
    admitted = apply_patch(p, d.patch)
    spec = admitted["spec"]
    for c in [*(spec.get("initContainers") or []), *spec["containers"]]:
        res = c.get("resources") or {}
        limits, requests = res.get("limits") or {}, res.get("requests") or {}
        for r in (VGPU, MEM, CORE):  # the API server refuses an extended resource whose request is not its limit
            assert r not in requests or limits.get(r) == requests[r], (c["name"], r, res)
    req = placement_request(admitted, MIXED)  # raises for an admitted pod the extender would never place
    if req is None:
        assert not d.usage
        return
    # the webhook's second look (reinvocation) at its own result admits it again, adding nothing
    again = decide(admitted, MIXED, (96, 160))
    assert again.allowed, again.message
    states = [CardState(Card("gpu-1", i, model)) for i in range(n)]
    result = fit(states, req, {})
    assume(result.ok)
    grants = [[] if s.empty else [CardGrant(device_id("gpu-1", i), s.memory * 512, s.cores) for i in result.cards]
              for s in req.shares_for(model)]
    bound = {**admitted, "metadata": {**admitted["metadata"], "annotations": {ALLOCATED: encode_allocation(grants)}},
             "spec": {**spec, "nodeName": "gpu-1"}}
    mem, cores, slices = req.booking_for(model)
    assert usage_from_annotations(bound) == PodUsage("gpu-1", result.cards, mem, cores, slices)
    usage = dict(d.usage)
    assert usage.get(VGPU) == (req.cards if req.whole_cards else slices)
    if req.whole_cards and req.model is not None:
        assert model == req.model  # fit keeps whole cards on their model
    assert usage.get(MEM) == mem * req.cards
    assert usage.get(CORE) == cores * req.cards
