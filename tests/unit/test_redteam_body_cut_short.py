"""Red team: a request body cut short by the caller's close still takes the 500 path.

cc78f3a's `read_body` (shared/serving/http.py) promises a BodyError for a body "cut short or malformed in its
framing (400)", and the commit "no 500 for an undecodable body". But a body cut short by the caller closing the
connection (or half-closing it: asyncio closes the transport on EOF) does not raise aiohttp's
RequestPayloadError: aiohttp's `connection_lost` cancels the request with `ConnectionResetError("Connection
lost")`, which `read_body` lets through. Then:

* /mutate, /webhook, /filter, /prioritize: aiohttp's generic 500 path, an ERROR "Error handling request" with a
  traceback per request;
* /bind: `h_bind`'s `except Exception` logs "bind failed" with a traceback and counts
  `mtsched_bindings_total{result="error"}`, the numerator of the chart's bind-failure-ratio alert
  (deploy/helm/.../prometheusrule.yaml) -- any caller that reaches the port can raise it, one connection each;
* /preempt: "preempt failed" with a traceback and PREEMPT_NODES{error}.

Expected: a body cut short is a BodyError (no bind counted as failed, no traceback). Fix: shared/serving/http.py
`read_body` (map ConnectionError / aiohttp.ClientConnectionResetError raised by request.read() to BodyError, or
let the handlers return quietly on a lost client).
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from prometheus_client import REGISTRY

from shared.serving.http import serve
from tests.unit._servers import extender, extender_app, webhook_app

HEAD = (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 400\r\n\r\n"
        b'{"PodName": "p", "PodNamespace": "ns"')


def _errors() -> float:
    return REGISTRY.get_sample_value("mtsched_bindings_total", {"result": "error"}) or 0.0


async def _cut_short(port: int, path: bytes) -> None:
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(HEAD % path)
    await writer.drain()
    await asyncio.sleep(0.2)  # the handler reads the body
    writer.close()
    await writer.wait_closed()


@pytest.mark.parametrize(("role", "path"), [
    ("webhook", b"/mutate"), ("extender", b"/filter"), ("extender", b"/bind"), ("extender", b"/preempt"),
])
async def test_redteam_a_body_cut_short_by_the_caller_is_no_server_error(role: str, path: bytes,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    app = webhook_app() if role == "webhook" else extender_app(extender())
    runner = await serve(app, "127.0.0.1:0")
    before = _errors()
    try:
        with caplog.at_level(logging.ERROR):
            await _cut_short(runner.addresses[0][1], path)
            await asyncio.sleep(0.5)  # the handler finishes
    finally:
        await runner.cleanup()
    tracebacks = [f"{r.name}: {r.getMessage()} ({r.exc_info[0].__name__})" for r in caplog.records
                  if r.levelno >= logging.ERROR and r.exc_info and r.exc_info[0] is not None]
    counted = _errors() - before
    assert not tracebacks and counted == 0, (
        f"{role} {path.decode()}: a caller that sent half a body and closed got the 500 path: {tracebacks}; "
        f"mtsched_bindings_total{{result=\"error\"}} +{counted}")
