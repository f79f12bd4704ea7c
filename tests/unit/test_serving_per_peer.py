"""One caller cannot take a port from the others (red team, 2026-12-05): the cap on open connections is also
counted per peer address (MAX_PER_PEER), on plain HTTP as the connection is made and on TLS at accept, before
any handshake; and /metrics, megabytes at scale, sends at most METRICS_AT_ONCE answers at a time, each within
METRICS_SEND_SECONDS, so callers that never read theirs hold neither the process's memory nor its probes."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from pathlib import Path

import pytest

from deploy.local.processes import free_port
from shared.config import load_config
from shared.serving import http, metrics
from shared.serving.http import serve, serve_health
from tests.unit._servers import webhook_app
from tests.unit.test_serving_limits import _tls_contexts, on_both_loops

CAP = 3


async def _open(port: int, source: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))


async def _served(port: int, source: str, ctx: ssl.SSLContext | None = None) -> bool:
    """A request from `source` (a loopback address of its own) gets an HTTP answer?"""
    try:
        r, w = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0), ssl=ctx,
                                             server_hostname="127.0.0.1" if ctx else None)
    except (ConnectionError, ssl.SSLError):
        return False
    try:
        w.write(b"GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n")
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            return (await asyncio.wait_for(r.read(64), 5)).startswith(b"HTTP/1.1 ")
        return False
    finally:
        w.close()


async def _scenario(ctx: tuple[ssl.SSLContext, ssl.SSLContext] | None) -> None:
    runner = await serve(webhook_app(), "127.0.0.1:0", ctx[0] if ctx else None)
    port = runner.addresses[0][1]
    held = [await _open(port, "127.0.0.2") for _ in range(CAP)]  # idle: no request, no ClientHello
    try:
        for _ in range(100):  # until the server has taken all of them (bounded)
            if not await _served(port, "127.0.0.2", ctx[1] if ctx else None):
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("a peer holding the cap still got a connection served")
        assert await _served(port, "127.0.0.3", ctx[1] if ctx else None), "another peer was refused"
    finally:
        for _, w in held:
            w.close()
        await runner.cleanup()


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
async def test_one_peer_cannot_hold_every_connection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     tls: bool) -> None:
    monkeypatch.setattr(http, "MAX_PER_PEER", CAP)
    ctx = _tls_contexts(tmp_path) if tls else None
    await on_both_loops(lambda: _scenario(ctx))


async def test_unread_metrics_answers_are_bounded_in_number_and_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "exposition", lambda: b"# big\n" * 4_000_000)  # 24 MB, as 2,000 nodes' cards
    monkeypatch.setattr(metrics, "METRICS_SEND_SECONDS", 1.0)
    port = free_port()
    health = await serve_health(load_config(env={}, flags={"metricsListen": f"127.0.0.1:{port}"}), list)
    readers = []
    try:
        for _ in range(metrics.METRICS_AT_ONCE):  # callers that ask and never read
            r, w = await asyncio.open_connection("127.0.0.1", port, limit=1024)
            w.transport.get_extra_info("socket").setsockopt(  # type: ignore[union-attr]
                __import__("socket").SOL_SOCKET, __import__("socket").SO_RCVBUF, 4096)
            w.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            readers.append((r, w))
        for _ in range(200):
            if metrics._metrics_slots == metrics.METRICS_AT_ONCE:
                break
            await asyncio.sleep(0.01)
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await asyncio.wait_for(r.read(64), 5)).startswith(b"HTTP/1.1 503"), "a third answer was made"
        w.close()
        r, w = await asyncio.open_connection("127.0.0.1", port)  # the probes are answered meanwhile
        w.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await asyncio.wait_for(r.read(64), 5)).startswith(b"HTTP/1.1 200")
        w.close()
        for _ in range(500):  # the unread answers are dropped after METRICS_SEND_SECONDS (bounded)
            if metrics._metrics_slots == 0:
                break
            await asyncio.sleep(0.02)
        assert metrics._metrics_slots == 0, "unread /metrics answers still held"
    finally:
        for _, w in readers:
            w.close()
        await health.cleanup()
