"""Red team (floods): the extender's events for a condition that lasts piled up one Event object a minute per pod.

A pod that can never be placed is filtered again and again (kube-scheduler's retries, every cluster event, our own
nudges). The extender sends its FilteringFailed event at most once a minute per (pod, reason, message), but each one
was a new Event object (`generateName`): a pod Pending for an hour left 60 identical Events in the API server's
store (per extender replica; one more after each restart), and `kubectl describe` listed them all, where
kube-scheduler's own FailedScheduling is one Event. Now the event's name is derived from the pod's uid, the reason
and the message, so the API server keeps one until it expires (its event TTL) and refuses the others (409).

Real API server, the extender's own identity (the chart's RBAC: create events, nothing more).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from controller.extender import EVENT_BURST
from deploy.local.controlplane import ControlPlane
from shared.kube import Kube
from shared.serving.bounded import ByteLRU
from tests.unit._servers import CFG, extender, pod

pytestmark = pytest.mark.e2e


async def test_a_pod_that_never_fits_keeps_one_event_however_often_it_is_filtered(
        control_plane: ControlPlane, namespace: str, extender_kube: Kube) -> None:
    ext = extender(kube=extender_kube)  # type: ignore[arg-type]
    uid = str(uuid.uuid4())
    waiting = pod(uid)
    waiting["metadata"]["namespace"] = namespace
    args: dict[str, Any] = {"Pod": waiting, "NodeNames": ["gone-node"]}  # a node the ledger does not hold: no fit

    def events() -> list[dict[str, Any]]:
        got = control_plane.api("GET", f"/api/v1/namespaces/{namespace}/events")["items"]
        return [e for e in got if e["involvedObject"].get("uid") == uid and e["reason"] == "FilteringFailed"]

    for sent in range(1, 4):
        ext._recent = ByteLRU(1 << 20)  # each filter stands for one a minute after the last (the memo's minute over)
        assert ext.filter(args)["NodeNames"] == []
        await asyncio.gather(*ext._events)  # (sent: the POST answered)
        assert events(), f"no event after filter {sent}"
    got = events()
    assert len(got) == 1, [(e["metadata"]["name"], e["message"]) for e in got]
    assert CFG.scheduler_name in got[0]["source"]["component"]


async def test_a_pod_whose_filter_message_keeps_changing_gets_a_bounded_number_of_events(
        control_plane: ControlPlane, namespace: str, extender_kube: Kube) -> None:
    """Under churn the text of a pending pod's FilteringFailed changes from one filter to the next (which nodes lack
    memory, which cores): each text was a new event, one per filter (kube-scheduler retries such a pod every few
    seconds, and sooner after each of our nudges), where kube-scheduler's own events on a pod are rate-limited."""
    ext = extender(kube=extender_kube)  # type: ignore[arg-type]
    uid = str(uuid.uuid4())
    waiting = pod(uid)
    waiting["metadata"]["namespace"] = namespace
    for i in range(12):  # each filter's failures name other nodes: another message each time
        assert ext.filter({"Pod": waiting, "NodeNames": [f"gone-{i}"]})["NodeNames"] == []
    await asyncio.gather(*ext._events)
    got = control_plane.api("GET", f"/api/v1/namespaces/{namespace}/events")["items"]
    mine = [e for e in got if e["involvedObject"].get("uid") == uid and e["reason"] == "FilteringFailed"]
    assert 1 <= len(mine) <= EVENT_BURST, [e["message"] for e in mine]
