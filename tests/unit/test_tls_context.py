"""The serving TLS context: no TLS 1.3 session tickets (nobody who calls us redeems one), TLS 1.2 still served.

Runs the real serve() over HTTPS on 127.0.0.1 with a client certificate, as the extender is
configured off loopback; the control case (OpenSSL's default of 2 tickets) shows the check can fail.
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

from aiohttp import web

from deploy.local.pki import write_pki
from shared.serving.http import serve
from shared.serving.listen import LISTEN_POLICY, ListenPolicy
from shared.serving.tls import CertReloader


async def _ticket_after_one_request(pki: Path, context: ssl.SSLContext, version: ssl.TLSVersion) -> bool:
    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/", ok)
    app[LISTEN_POLICY] = ListenPolicy("extender", "127.0.0.1:0", str(pki / "ca.crt"))
    runner = await serve(app, "127.0.0.1:0", context)
    client = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    client.load_cert_chain(str(pki / "client.crt"), str(pki / "client.key"))
    client.minimum_version = client.maximum_version = version
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", runner.addresses[0][1], ssl=client,
                                                       server_hostname="localhost")
        writer.write(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        reply = await reader.read()  # tickets come after the handshake: read to the end first
        assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"ok")
        sslobj = writer.get_extra_info("ssl_object")
        assert sslobj.version() == {ssl.TLSVersion.TLSv1_3: "TLSv1.3", ssl.TLSVersion.TLSv1_2: "TLSv1.2"}[version]
        has_ticket = bool(sslobj.session.has_ticket)
        writer.close()
        return has_ticket
    finally:
        await runner.cleanup()


async def test_the_serving_context_issues_no_tls13_session_ticket(tmp_path: Path) -> None:
    pki = write_pki(tmp_path).dir
    reloader = CertReloader(str(pki / "serving.crt"), str(pki / "serving.key"))
    assert reloader.context.num_tickets == 0
    assert await _ticket_after_one_request(pki, reloader.context, ssl.TLSVersion.TLSv1_3) is False


async def test_tls12_clients_are_still_served(tmp_path: Path) -> None:
    """num_tickets is TLS 1.3's setting; a TLS 1.2 client is served as before (with its one ticket)."""
    pki = write_pki(tmp_path).dir
    context = CertReloader(str(pki / "serving.crt"), str(pki / "serving.key")).context
    await _ticket_after_one_request(pki, context, ssl.TLSVersion.TLSv1_2)


async def test_control_openssl_default_issues_tickets(tmp_path: Path) -> None:
    pki = write_pki(tmp_path).dir
    context = CertReloader(str(pki / "serving.crt"), str(pki / "serving.key")).context
    context.num_tickets = 2
    assert await _ticket_after_one_request(pki, context, ssl.TLSVersion.TLSv1_3) is True
