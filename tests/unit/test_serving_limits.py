"""What a caller may hold of any of our ports (shared/serving/http.py): a stalled request is cut off in bounded
time, and connections past the cap are closed as they are accepted.

Found by a red team: a request whose body never finished held its handler forever, one whose headers never
finished was closed only by aiohttp's keep-alive timer after 3630 s, and nothing capped the connections a
caller could open (each ~11 KiB; the webhook's port is open to any source). The limits are shortened here
(module constants, read at each call) so the test does not wait for the real ones; their values are checked
against the reasons the module gives for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import uvloop
from prometheus_client import REGISTRY

from deploy.local.pki import make_ca, make_serving_cert
from deploy.local.processes import free_port
from shared.config import load_config
from shared.serving import http
from shared.serving.http import serve, serve_health
from tests.unit._servers import webhook_app

CAP = 15.0  # how long the test waits for an answer or a close (a connection held longer counts as held)


async def _held(port: int, data: bytes) -> tuple[float, bytes]:
    """Seconds until the server answers or closes a connection that sent `data` and then nothing, and the
    first bytes of its answer (b"" when it closed without one)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    start = time.monotonic()
    got = b""
    try:
        writer.write(data)
        await writer.drain()
        with contextlib.suppress(TimeoutError, ConnectionError):
            got = await asyncio.wait_for(reader.read(64), CAP)
        return time.monotonic() - start, got
    finally:
        writer.close()


def test_the_limits_keep_to_their_reasons() -> None:
    assert http.IDLE_SECONDS > 90, "Go's HTTP clients close idle connections after 90 s: the server must not first"
    assert http.BODY_SECONDS < 30, "the API server waits 30 s at most for a webhook"
    assert 64 <= http.MAX_CONNECTIONS <= 4096


async def test_stalled_requests_are_cut_off_in_bounded_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http, "IDLE_SECONDS", 2.0)
    monkeypatch.setattr(http, "BODY_SECONDS", 1.0)
    wport, mport = free_port(), free_port()
    webhook = await serve(webhook_app(), f"127.0.0.1:{wport}")
    health = await serve_health(load_config(env={}, flags={"metricsListen": f"127.0.0.1:{mport}"}), list)
    try:
        partial_body = (b"POST /mutate HTTP/1.1\r\nHost: hami-webhook\r\nContent-Type: application/json\r\n"
                        b"Content-Length: 4096\r\n\r\n{\"apiVersion\": ")
        partial_headers = b"POST /mutate HTTP/1.1\r\nHost: hami-webhook\r\nContent-Le"
        partial_get = b"GET /metrics HTTP/1.1\r\nHost: x\r\n"
        body, headers, get, idle = await asyncio.gather(
            _held(wport, partial_body), _held(wport, partial_headers), _held(mport, partial_get), _held(wport, b""))
    finally:
        await webhook.cleanup()
        await health.cleanup()
    assert body[1].startswith(b"HTTP/1.1 408"), f"a body that never finished: {body}"
    held = {name: round(t, 1) for name, (t, _) in {"body": body, "headers": headers, "metrics headers": get,
                                                 "idle": idle}.items() if t >= CAP}
    assert not held, f"connections held {CAP} s with neither an answer nor a close: {held}"
    assert headers[1] == get[1] == idle[1] == b"", (headers, get, idle)  # closed, nothing answered


async def test_connections_past_the_cap_are_closed_as_they_come(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http, "MAX_CONNECTIONS", 4)
    port = free_port()
    runner = await serve(webhook_app(), f"127.0.0.1:{port}")
    before = REGISTRY.get_sample_value("mtsched_http_connections_refused_total") or 0.0
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(4)]
    try:
        await asyncio.sleep(0)  # (accepting is the server's: the fifth below waits for its answer)
        extra_reader, extra_writer = await asyncio.open_connection("127.0.0.1", port)
        got = await asyncio.wait_for(extra_reader.read(64), CAP)
        extra_writer.close()
        assert got == b"", "the fifth connection was served"
        assert (REGISTRY.get_sample_value("mtsched_http_connections_refused_total") or 0.0) == before + 1
        # one of the four closes: a new connection is served again
        conns[0][1].close()
        await conns[0][1].wait_closed()

        async def served() -> bool:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            try:
                w.write(b"GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n")
                return (await asyncio.wait_for(r.read(64), CAP)).startswith(b"HTTP/1.1 ")
            finally:
                w.close()

        for _ in range(100):  # until the server has seen the close (bounded)
            if await served():
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("no connection served after one of the four closed")
    finally:
        for _, w in conns[1:]:
            w.close()
        await runner.cleanup()


def _tls_contexts(tmp: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    ca = make_ca()
    leaf = make_serving_cert(ca, "127.0.0.1")
    (tmp / "s.crt").write_bytes(leaf.cert_pem)
    (tmp / "s.key").write_bytes(leaf.key_pem)
    (tmp / "ca.crt").write_bytes(ca.cert_pem)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(str(tmp / "s.crt"), str(tmp / "s.key"))
    client = ssl.create_default_context(cafile=str(tmp / "ca.crt"))
    client.check_hostname = False
    return server, client


async def on_both_loops(scenario: Callable[[], Awaitable[None]]) -> None:
    """The scenario on this test's event loop, then on uvloop (what the roles run: its transports and TLS layer
    are not asyncio's), in a thread of its own."""
    await scenario()
    await asyncio.to_thread(uvloop.run, scenario())


async def test_a_tls_port_closes_a_connection_that_never_starts_tls_and_serves_one_that_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The handshake is bounded (HANDSHAKE_SECONDS, shortened here); a caller that completes it and sends its
    request at once is answered, over keep-alive, several times."""
    monkeypatch.setattr(http, "HANDSHAKE_SECONDS", 1.0)
    server_ctx, client_ctx = _tls_contexts(tmp_path)
    await on_both_loops(lambda: _tls_scenario(server_ctx, client_ctx))


async def _tls_scenario(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext) -> None:
    port = free_port()
    runner = await serve(webhook_app(), f"127.0.0.1:{port}", server_ctx)
    try:
        silent, answer = await _held(port, b"")  # TCP only: no ClientHello ever
        assert silent < CAP and answer == b"", (silent, answer)
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_ctx, server_hostname="x")
        try:
            for _ in range(3):
                writer.write(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             b"Content-Length: 2\r\n\r\n{}")
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), CAP)
                assert head.startswith(b"HTTP/1.1 400"), head  # {} is no AdmissionReview: a 400 naming the field
                length = int(next(v for k, _, v in (line.partition(b":") for line in head.split(b"\r\n"))
                                  if k.lower() == b"content-length"))
                assert b"error" in await asyncio.wait_for(reader.readexactly(length), CAP)
        finally:
            writer.close()
    finally:
        await runner.cleanup()
