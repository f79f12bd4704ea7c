"""One caller cannot take a port from the others (red team, 2026-12-05): the cap on open connections is also
counted per peer address (MAX_PER_PEER), on plain HTTP as the connection is made and on TLS at accept, before
any handshake; and /metrics, megabytes at scale, sends at most METRICS_AT_ONCE answers at a time, each within
METRICS_SEND_SECONDS, so callers that never read theirs hold neither the process's memory nor its probes."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from pathlib import Path

import pytest
from aiohttp import web

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


async def test_a_peer_cannot_keep_its_share_through_requests_it_hung_up_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Red team (second round): aiohttp keeps a handler (and counts it in the port's cap) until it ends, after its
    caller went; the peer's count dropped at the hang-up, so hung-up slow requests held any number of slots."""
    monkeypatch.setattr(http, "MAX_PER_PEER", CAP)
    gate = asyncio.Event()

    async def slow(_: web.Request) -> web.Response:  # a review waiting for a quota read, a bind...
        await gate.wait()
        return web.Response(text="done")

    app = web.Application()
    app.router.add_post("/slow", slow)
    runner = await serve(app, "127.0.0.1:0")
    port = runner.addresses[0][1]
    server = runner.server
    try:
        for _ in range(3 * CAP):
            _r, w = await _open(port, "127.0.0.2")
            w.write(b"POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
            await w.drain()
            await asyncio.sleep(0.02)
            w.close()
        await asyncio.sleep(0.2)
        assert len(server.connections) <= CAP, "one peer holds more than its share"  # type: ignore[union-attr]
        assert await _served(port, "127.0.0.3")
    finally:
        gate.set()
        await runner.cleanup()


async def test_unread_metrics_answers_are_bounded_in_number_and_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "exposition", lambda: b"# big\n" * 4_000_000)  # 24 MB, as 2,000 nodes' cards
    monkeypatch.setattr(metrics, "METRICS_SEND_SECONDS", 1.0)
    port = free_port()
    health = await serve_health(load_config(env={}, flags={"metricsListen": f"0.0.0.0:{port}"}), list)
    readers = []

    async def get(source: str, path: str = "/metrics") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        r, w = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0), limit=1024)
        w.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        w.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        return r, w

    try:
        readers.append(await get("127.0.0.2"))  # a caller that asks and never reads
        for _ in range(200):
            if metrics._metrics_slots == 1:
                break
            await asyncio.sleep(0.01)
        r, w = await get("127.0.0.2")  # the same address again: its one answer is being sent
        assert (await asyncio.wait_for(r.read(64), 5)).startswith(b"HTTP/1.1 503")
        w.close()
        for i in range(3, 2 + metrics.METRICS_AT_ONCE):  # other addresses, up to the slots in all
            readers.append(await get(f"127.0.0.{i}"))
        for _ in range(200):
            if metrics._metrics_slots == metrics.METRICS_AT_ONCE:
                break
            await asyncio.sleep(0.01)
        r, w = await get("127.0.0.100")
        assert (await asyncio.wait_for(r.read(64), 5)).startswith(b"HTTP/1.1 503"), "one more answer was made"
        w.close()
        r, w = await get("127.0.0.100", "/healthz")  # the probes are answered meanwhile
        assert (await asyncio.wait_for(r.read(64), 5)).startswith(b"HTTP/1.1 200")
        w.close()
        for _ in range(500):  # the unread answers are dropped after METRICS_SEND_SECONDS (bounded)
            if metrics._metrics_slots == 0:
                break
            await asyncio.sleep(0.02)
        assert metrics._metrics_slots == 0 and not metrics._metrics_peers, "unread /metrics answers still held"
    finally:
        for _, w in readers:
            w.close()
        await health.cleanup()
