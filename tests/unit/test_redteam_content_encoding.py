"""Red team: a body that cannot be decoded under its Content-Encoding reaches a 500.

aiohttp decodes `Content-Encoding: gzip` / `deflate` request bodies by itself inside `request.read()`;
a body that is not what the header says raises aiohttp's RequestPayloadError ("Can not decode
content-encoding"), which neither the webhook's handler nor the extender's `_read` catches (they catch
orjson.JSONDecodeError only). The webhook, /filter and /prioritize then answer HTTP 500 "Server got itself
in trouble" and log a traceback per request (anyone who reaches the webhook's port can send them: it
authenticates nobody without webhookClientCAFile); /bind answers 200 with the exception's repr, and
/preempt answers 200 with no victims, as if the body had been an empty preemption request.

The promise: bad input gets a clear 4xx naming what is wrong, never a 500. Fix: webhook/server.py
h_review and controller/extender.py `_read` (and controller/preempt.py's read) turn
aiohttp.web_protocol.RequestPayloadError (or any error of request.read()) into a 400 naming the body and
its Content-Encoding (or refuse a Content-Encoding at all: the API server and kube-scheduler send none).
"""

from __future__ import annotations

import gzip

import pytest
from aiohttp.test_utils import TestClient, TestServer
from aiohttp.web import Application

from tests.unit._servers import extender, extender_app, webhook_app

BODIES = {
    "not-compressed": b'{"apiVersion": "admission.k8s.io/v1"}',
    "gzip-with-trailing-junk": gzip.compress(b"{}") + b"junk",
}


def _app(role: str) -> Application:
    return webhook_app() if role == "webhook" else extender_app(extender())


@pytest.mark.parametrize(("role", "path"), [
    ("webhook", "/mutate"), ("webhook", "/webhook"),
    ("extender", "/filter"), ("extender", "/prioritize"), ("extender", "/bind"), ("extender", "/preempt"),
])
async def test_an_undecodable_content_encoding_is_a_400(role: str, path: str) -> None:
    got = {}
    for body_name, body in BODIES.items():
        for encoding in ("gzip", "deflate"):
            async with TestClient(TestServer(_app(role))) as client:
                resp = await client.post(path, data=body, headers={"Content-Encoding": encoding,
                                                                   "Content-Type": "application/json"})
                text = await resp.text()
                if not (400 <= resp.status < 500 and "error" in text.lower()):
                    got[f"{body_name} as {encoding}"] = (resp.status, text[:100])
    assert not got, f"{role} {path}: bodies it cannot decode were not answered with a 4xx error: {got}"
