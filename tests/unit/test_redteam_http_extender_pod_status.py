"""The fields of the Pod in ExtenderArgs that filter and prioritize read beyond the shape checks (red team,
2026-12-07): `status.nominatedNodeName` (filter holds the pod's cards on that node) and `spec.priority` (the pods
nominated ahead of it). A `status` that was no object reached `(pod.get("status") or {}).get(...)`: filter answered
200 with `"Error": "filter: AttributeError: 'list' object has no attribute 'get'"` (and logged a traceback) instead
of a 400 naming the field; a `spec.priority` of "high" or 2^62 was read as 0 by filter and prioritize, where
preempt refused it. Now all three verbs refuse them with HTTP 400 naming the field, the value and what is allowed."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from tests.unit._servers import extender, extender_app, pod


def _with(**fields: Any) -> dict[str, Any]:
    p = pod()
    for path, value in fields.items():
        where = p
        *parents, last = path.split("__")
        for key in parents:
            where = where.setdefault(key, {})
        where[last] = value
    return p


BAD = [
    (_with(status=[1]), "Pod.status: got a list of 1 items; allowed: an object"),
    (_with(status="Pending"), "Pod.status: got 'Pending'; allowed: an object"),
    (_with(status__nominatedNodeName=5), "Pod.status.nominatedNodeName: got 5; allowed: a node name"),
    (_with(status__nominatedNodeName="a/../b"), "Pod.status.nominatedNodeName: got 'a/../b'; allowed: a node name"),
    (_with(spec__priority="high"), "Pod.spec.priority: got 'high'; allowed: a 32-bit integer"),
    (_with(spec__priority=2**62), "Pod.spec.priority: got 4611686018427387904; allowed: a 32-bit integer"),
    (_with(spec__priority=True), "Pod.spec.priority: got true; allowed: a 32-bit integer"),
]


@pytest.mark.parametrize(("p", "error"), BAD)
async def test_redteam_a_malformed_status_or_priority_is_a_400_naming_it(p: dict[str, Any], error: str) -> None:
    args = {"/filter": {"Pod": p, "NodeNames": ["s5k"]}, "/prioritize": {"Pod": p, "NodeNames": ["s5k"]},
            "/preempt": {"Pod": p, "NodeNameToMetaVictims": {"s5k": {"Pods": [{"UID": "v1"}]}}}}
    ext = extender()
    async with TestClient(TestServer(extender_app(ext))) as client:
        for verb, doc in args.items():
            resp = await client.post(verb, json=doc)
            assert resp.status == 400, (verb, await resp.text())
            got = (await resp.json())["error"]
            assert got.startswith(error), (verb, got)
    assert not ext.held and not ext.nominations.by_uid  # nothing held for a pod refused


GOOD = [_with(status={}), _with(status=None), _with(status__nominatedNodeName=""),
        _with(status__nominatedNodeName="s5k"), _with(spec__priority=-(2**31)), _with(spec__priority=2**31 - 1),
        _with(status__phase="Pending", status__conditions=[{"type": "PodScheduled", "status": "False"}])]


@pytest.mark.parametrize("p", GOOD)
async def test_what_kube_scheduler_sends_is_still_placed(p: dict[str, Any]) -> None:
    async with TestClient(TestServer(extender_app(extender()))) as client:
        resp = await client.post("/filter", json={"Pod": p, "NodeNames": ["s5k"]})
        assert resp.status == 200 and (await resp.json())["NodeNames"] == ["s5k"], await resp.text()
        resp = await client.post("/prioritize", json={"Pod": p, "NodeNames": ["s5k"]})
        assert resp.status == 200, await resp.text()
