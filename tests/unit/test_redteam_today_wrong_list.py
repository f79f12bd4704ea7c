"""Red team (today's changes), a case today's single-object check (shared/kube.py `_the_object`) left out: a list
answered with a success that is no list (`{}`, or a Status, from a misbehaving proxy in front of the API server)
was read as an empty list, with no resourceVersion. The watchers' re-list replaced their view with no pods (the
quarantines of nodes where pods nobody accounts for hold cards lifted with it) and watched on from no version;
the reconciler's consistent read of a node's pods, which verifies a node after a Redis failover because it holds
the Bindings the watch may not have brought yet, found none, so such a Binding was booked nowhere. Now a list page
must be a *List with its metadata and items, else it fails as the API unreachable (502, transient): retried,
nothing decided on it."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web

from controller.reflector import Reflector
from shared.kube import KubeError, the_list
from shared.serving.supervise import is_transient
from tests.unit._api_standin import nothing, serve

__all__ = ["serve"]  # the loopback stand-in API server (a fixture): the tests ask for it by name

NOT_LISTS = [
    {},
    {"kind": "Status", "apiVersion": "v1", "status": "Success"},
    {"items": []},  # no metadata: no list's answer
    {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "p1", "resourceVersion": "5"}},
]



@pytest.mark.parametrize("answer", NOT_LISTS)
async def test_a_list_answered_with_something_else_fails_as_unreachable(serve: Any, answer: Any) -> None:
    async def handler(req: web.Request) -> web.Response:
        return web.json_response(answer)

    kube, _ = await serve(handler)
    r = Reflector(kube, "/api/v1/pods", nothing, nothing, "pods")
    with pytest.raises(KubeError) as e:
        await r.list()
    assert e.value.status == 502 and is_transient(e.value) and "not a list" in str(e.value)


async def test_real_lists_are_read(serve: Any) -> None:
    pages = {"": {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "7", "continue": "c1"},
                  "items": [{"metadata": {"name": "a", "namespace": "ns", "uid": "u1"}}]},
             "c1": {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "7"}, "items": []}}

    async def handler(req: web.Request) -> web.Response:
        return web.json_response(pages[req.query.get("continue", "")])

    kube, _ = await serve(handler)
    items, rv = await Reflector(kube, "/api/v1/pods", nothing, nothing, "pods").list()
    assert rv == "7" and [i["metadata"]["uid"] for i in items] == ["u1"]


@pytest.mark.parametrize("answer", NOT_LISTS)
def test_the_list(answer: Any) -> None:
    with pytest.raises(KubeError):
        the_list(answer, "GET /api/v1/pods")
    ok = {"kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": None}  # (null items: none)
    assert the_list(ok, "GET /api/v1/pods") == []
