"""filter and prioritize answer even when they raise (a bug, not an input error: those are 400s): filter with
no node and an error, so kube-scheduler retries the pod; prioritize with no score. Never aiohttp's text 500
(red team, 2026-12-05: /bind, /preempt and /mutate had a catch-all, these two did not)."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import REGISTRY

from tests.unit._servers import extender, extender_app

ARGS = {"Pod": {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": {"containers": []}},
        "NodeNames": ["n1"]}


@pytest.mark.parametrize(("verb", "want"), [
    ("filter", {"NodeNames": [], "FailedNodes": {}, "Error": "filter: RuntimeError: a bug"}),
    ("prioritize", []),
])
async def test_a_verb_that_raises_answers_and_places_nothing(monkeypatch: pytest.MonkeyPatch, verb: str,
                                                             want: Any) -> None:
    ext = extender()
    app = extender_app(ext)

    def boom(_: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(ext, verb, boom)
    before = REGISTRY.get_sample_value("mtsched_extender_errors_total", {"verb": verb}) or 0.0
    async with TestClient(TestServer(app)) as client:
        resp = await client.post(f"/{verb}", json=ARGS)
        assert resp.status == 200 and resp.content_type == "application/json"
        assert await resp.json() == want
    assert REGISTRY.get_sample_value("mtsched_extender_errors_total", {"verb": verb}) == before + 1
