"""Red team: a failed Binding releases the pod's booking in Redis, and kube-scheduler at once moves every
parked pod back to its queues (handleBindingCycleError: EventAssignedPodDelete); a pod whose backoff is
over is filtered again within milliseconds. That filter must see the freed cards. reserve hands its feed
message to the caller's mirror at once (Extender._apply_feed); release did not, so the extender's mirror
kept the released booking until the feed brought it, and the watchers' Nudger never covers this path (the
extender has no RBAC to patch nodes): a filter answered in that window parks the pod until an unrelated
event or kube-scheduler's 5-minute flush."""

from __future__ import annotations

import pytest

from shared.kube import KubeError
from tests.redis.test_extender_bind import pod, setup  # noqa: F401 (the fixture)

pytestmark = pytest.mark.redis


async def test_redteam_a_failed_bind_frees_the_cards_in_its_own_mirror_at_once(setup) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    ext, kube, _ledger = setup
    p = pod("u5", {"mthreads.com/vgpu": 2, "mthreads.com/sgpu-memory": 192, "mthreads.com/sgpu-core": 32})
    kube.pods[("ns", "p-u5")] = p
    # the feed loop behind (a burst of messages ahead of ours): stopped, so what follows does not depend on
    # which socket the event loop reads first (without this the test fails about every other run)
    await ext.mirror.stop()
    kube.fail_with = KubeError(409, {"message": "pod p-u5 is being deleted"}, "bind")
    out = await ext.bind({"PodName": "p-u5", "PodNamespace": "ns", "PodUID": "u5", "Node": "s4k"})
    assert "failed, reservation released" in out["Error"]
    # no await between the bind's answer and the next filter: kube-scheduler's retry may come first
    snap = ext.mirror.get("s4k")
    assert snap is not None and "u5" not in snap.reservations, "the mirror still books the released pod"
    other = pod("u6", {"mthreads.com/vgpu": 2, "mthreads.com/sgpu-memory": 192, "mthreads.com/sgpu-core": 32})
    assert ext.filter({"Pod": other, "NodeNames": ["s4k"], "Nodes": None})["NodeNames"] == ["s4k"]
