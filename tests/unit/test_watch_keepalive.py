"""A watch connection probes its peer (TCP keepalive, controller/reflector.py keep_alive): a peer that vanished
without a reset ends the stream within about a minute instead of at sock_read (330 s), with the pod view blind
meanwhile. Checked on a real loopback connection, under asyncio's loop and uvloop's (the roles run uvloop)."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest
import uvloop
from aiohttp import web

from controller.reflector import KEEPALIVE_COUNT, KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, keep_alive


async def _probe() -> dict[str, int]:
    app = web.Application()
    done = asyncio.Event()

    async def watch(request: web.Request) -> web.StreamResponse:  # a stream that stays open, as a watch
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b"{}\n")
        await done.wait()
        return resp

    app.router.add_get("/w", watch)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/w") as resp:
            assert keep_alive(resp)
            assert resp.connection is not None and resp.connection.transport is not None
            sock = resp.connection.transport.get_extra_info("socket")
            got = {"on": sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)}
            for name in ("TCP_KEEPIDLE", "TCP_KEEPINTVL", "TCP_KEEPCNT"):
                if hasattr(socket, name):
                    got[name] = sock.getsockopt(socket.IPPROTO_TCP, getattr(socket, name))
            done.set()
            await resp.read()
            return got
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_watch_connection_probes_its_peer(loop: str) -> None:
    got = uvloop.run(_probe()) if loop == "uvloop" else asyncio.run(_probe())
    assert got["on"] != 0
    if hasattr(socket, "TCP_KEEPIDLE"):  # Linux: the probe times, not the system's default (2 hours)
        assert (got["TCP_KEEPIDLE"], got["TCP_KEEPINTVL"], got["TCP_KEEPCNT"]) == (
            KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_COUNT)
