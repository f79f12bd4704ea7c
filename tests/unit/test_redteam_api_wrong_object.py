"""Red team (API server) observation: a success answer that is not the object asked for (`{}`, or another object, from
a misbehaving proxy in front of the API server) was read as that pod or node. The reconciler's question about a
booking no holder explains took `{}` for "another pod of that name": stale, its cards freed under a running pod.
Now a single-object read checks the answer names what it asked for, else fails as the API unreachable (502,
transient): retried, nothing decided on it."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web

from shared.kube import KubeError
from shared.serving.supervise import is_transient
from tests.unit._api_standin import serve

__all__ = ["serve"]  # the loopback stand-in API server (a fixture): the tests ask for it by name

POD = {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "p1", "namespace": "ns", "uid": "u1"}}
NODE = {"kind": "Node", "apiVersion": "v1", "metadata": {"name": "n1"}}


@pytest.mark.parametrize("answer", [
    {},
    {"kind": "Status", "status": "Success"},
    {**POD, "metadata": {**POD["metadata"], "name": "p2"}},  # another pod
    {**POD, "metadata": {**POD["metadata"], "namespace": "other"}},
    {**NODE, "metadata": {"name": "p1"}},  # another kind of that name
])
async def test_a_read_answered_with_something_else_fails_as_unreachable(serve: Any, answer: Any) -> None:
    async def handler(req: web.Request) -> web.Response:
        return web.json_response(answer)

    kube, _ = await serve(handler)
    with pytest.raises(KubeError) as e:
        await kube.get_pod("ns", "p1")
    assert e.value.status == 502 and is_transient(e.value) and "not the Pod asked for" in str(e.value)


async def test_the_objects_asked_for_are_returned(serve: Any) -> None:
    async def handler(req: web.Request) -> web.Response:
        return web.json_response(NODE if "/nodes/" in req.path else POD)

    kube, _ = await serve(handler)
    assert (await kube.get_pod("ns", "p1"))["metadata"]["uid"] == "u1"
    assert (await kube.get_node("n1"))["metadata"]["name"] == "n1"
    with pytest.raises(KubeError):
        await kube.get_node("n2")
