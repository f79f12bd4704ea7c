"""Red team: the per-port connection cap does not hold on a TLS port.

cc78f3a caps the connections open at once per port (`shared/serving/http.py` `_CappedServer`, MAX_CONNECTIONS)
and promises that more are "closed as they are accepted". The cap counts `web.Server.connections`, which
aiohttp fills in `RequestHandler.connection_made`. On a TLS site asyncio wraps the protocol the factory returns
in an SSLProtocol and calls its `connection_made` only once the TLS handshake is done: a connection whose
handshake never finishes is in no count (any number of them pass the check), and one past the cap (`_Refused`)
is not closed as accepted either, but held until asyncio's ssl_handshake_timeout (60 s). The webhook's port is
always TLS in a cluster and open to any source (without webhookClientCAFile it authenticates nobody): the flood
of idle connections the cap was written for still grows the role without bound there, one TCP SYN each, no
TLS needed.

Expected: on a TLS port, as on plain HTTP, connections past the cap are closed as they come (the count taken at
accept, not after the handshake; or a short handshake timeout). Fix: shared/serving/http.py (count in the
factory / track until connection_lost, and pass ssl_handshake_timeout to TCPSite).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from pathlib import Path

import pytest

from shared.serving import http
from shared.serving.http import serve
from tests.unit._servers import webhook_app
from tests.unit.test_serving_limits import _tls_contexts, on_both_loops

CAP = 4
EXTRA = 12
WAIT = 5.0  # how long a connection past the cap may stay open (plain HTTP: milliseconds)


async def _closed_within(port: int, seconds: float) -> bool:
    """A raw TCP connection that sends nothing (no ClientHello): closed by the server within `seconds`?"""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        with contextlib.suppress(ConnectionError):
            return await asyncio.wait_for(reader.read(1), seconds) == b""
        return True
    except TimeoutError:
        return False
    finally:
        writer.close()


async def test_redteam_connections_past_the_cap_are_closed_as_they_come_on_a_tls_port(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http, "MAX_CONNECTIONS", CAP)
    server_ctx, client_ctx = _tls_contexts(tmp_path)

    await on_both_loops(lambda: _scenario(server_ctx, client_ctx))


async def _scenario(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext) -> None:
    runner = await serve(webhook_app(), "127.0.0.1:0", server_ctx)
    port = runner.addresses[0][1]
    held = []
    try:
        # the cap reached by callers that completed their handshake and stay idle
        for _ in range(CAP):
            held.append(await asyncio.open_connection("127.0.0.1", port, ssl=client_ctx, server_hostname="x"))
        await asyncio.sleep(0.1)
        closed = await asyncio.gather(*(_closed_within(port, WAIT) for _ in range(EXTRA)))
    finally:
        for _, w in held:
            w.close()
        await runner.cleanup()
    kept = closed.count(False)
    assert kept == 0, (f"{CAP} connections open (the cap), then {EXTRA} more that never start TLS: {kept} of them "
                       f"were still open after {WAIT} s (plain HTTP closes them at once; TLS holds them until "
                       "the 60 s handshake timeout, uncounted)")
