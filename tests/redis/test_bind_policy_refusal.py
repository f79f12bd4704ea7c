"""An extender whose Bindings the chart's admission policy refuses for who it is says so in its readiness (the
`bindings` check, controller/extender.py bindings_problem), and is ready again once a Binding goes through; a
refusal any pod can cause leaves it ready."""

from __future__ import annotations

from controller.extender import Extender
from shared.kube import KubeError
from shared.store.ledger import Ledger
from tests.redis.test_extender_bind import FakeKube, pod
from tests.redis.test_extender_bind import setup as setup  # the fixture, reused

SLICE = {"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 8, "mthreads.com/sgpu-core": 2}
POLICY = {"message": "pods \"p\" is forbidden: ValidatingAdmissionPolicy 'hami-allocation-records' with binding "
                     "'hami-allocation-records' denied request: a Binding carrying hami.io/mthreads-devices-allocated "
                     "may only be made by hami-scheduler (it books the cards the record names)"}


async def bind(ext: Extender, kube: FakeKube, uid: str) -> str:
    kube.pods[("ns", f"p-{uid}")] = pod(uid, SLICE)
    out = await ext.bind({"PodName": f"p-{uid}", "PodNamespace": "ns", "PodUID": uid, "Node": "s5k"})
    return str(out["Error"])


async def test_refused_by_the_policy_the_extender_is_unready_until_a_binding_goes_through(
        setup: tuple[Extender, FakeKube, Ledger]) -> None:
    ext, kube, ledger = setup
    assert ext.bindings_problem() == ""
    kube.fail_with = KubeError(403, POLICY, "bind")
    assert "may only be made by hami-scheduler" in await bind(ext, kube, "r1")
    why = ext.bindings_problem()
    assert "admission policy refuses this extender's Bindings" in why, why
    snap = await ledger.snapshot("s5k")
    assert snap is not None and not snap.reservations  # given back, as any refused Binding
    kube.fail_with = None
    assert await bind(ext, kube, "r2") == ""
    assert ext.bindings_problem() == ""


async def test_a_refusal_a_pod_can_cause_leaves_it_ready(setup: tuple[Extender, FakeKube, Ledger]) -> None:
    ext, kube, _ = setup
    for status, message in ((409, "pod p-x is being deleted"),
                            (403, "admission webhook \"zones\" denied the request: not on this node"),
                            (422, POLICY["message"])):
        kube.fail_with = KubeError(status, {"message": message}, "bind")
        assert await bind(ext, kube, f"x{status}")
        assert ext.bindings_problem() == "", (status, message)
