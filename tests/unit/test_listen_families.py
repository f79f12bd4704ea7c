"""An unspecified listen address (0.0.0.0, ::, or none) serves both address families, as Go's net.Listen and so
every Kubernetes component read it: the kubelet's probes and the API server reach a pod at its IPv6 address in
an IPv6 or IPv6-first cluster. A host without IPv6 serves IPv4 alone; a port taken in either family is an error.

Real sockets on loopback (::1 and 127.0.0.1), the real serve(), plain and TLS (the webhook's _TLSSite).
"""

from __future__ import annotations

import asyncio
import errno
import socket
import ssl
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from deploy.local.pki import write_pki
from shared.serving import http
from shared.serving.http import listen_sockets, serve
from shared.serving.tls import CertReloader


def _has_ipv6() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


needs_ipv6 = pytest.mark.skipif(not _has_ipv6(), reason="this machine has no IPv6 loopback")


def _app() -> web.Application:
    async def ok(request: web.Request) -> web.Response:
        return web.Response(text=request.remote or "")

    app = web.Application()
    app.router.add_get("/", ok)
    return app


async def _get(host: str, port: int, context: ssl.SSLContext | None = None) -> bytes:
    reader, writer = await asyncio.open_connection(host, port, ssl=context,
                                                   server_hostname="localhost" if context else None)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    reply = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return reply


@needs_ipv6
@pytest.mark.parametrize("host", ["0.0.0.0", "::", "[::]", ""])
@pytest.mark.parametrize("tls", [False, True])
async def test_an_unspecified_address_answers_ipv4_and_ipv6_on_one_port(tmp_path: Path, host: str,
                                                                        tls: bool) -> None:
    pki = write_pki(tmp_path).dir
    context = CertReloader(str(pki / "serving.crt"), str(pki / "serving.key")).context if tls else None
    client = ssl.create_default_context(cafile=str(pki / "ca.crt")) if tls else None
    if client is not None:
        client.check_hostname = False  # the test certificate names 127.0.0.1, not ::1
    runner = await serve(_app(), f"{host}:0", context)
    try:
        families = {socket.AF_INET6 if ":" in str(a[0]) else socket.AF_INET: a[1] for a in runner.addresses}
        assert set(families) == {socket.AF_INET, socket.AF_INET6}, runner.addresses
        assert len(set(families.values())) == 1  # one port for both
        port = families[socket.AF_INET]
        v4, v6 = await _get("127.0.0.1", port, client), await _get("::1", port, client)
        # each peer seen as itself (not as ::ffff:127.0.0.1): the per-peer limits count it once
        assert v4.startswith(b"HTTP/1.1 200") and v4.endswith(b"127.0.0.1"), v4
        assert v6.startswith(b"HTTP/1.1 200") and v6.endswith(b"::1"), v6
    finally:
        await runner.cleanup()


async def test_a_specific_address_is_the_only_one_served() -> None:
    runner = await serve(_app(), "127.0.0.1:0")
    try:
        assert [a[0] for a in runner.addresses] == ["127.0.0.1"]
    finally:
        await runner.cleanup()


def test_a_host_without_ipv6_serves_ipv4_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    real = socket.create_server

    def no_ipv6(address: Any, *, family: int = socket.AF_INET, **kw: Any) -> socket.socket:
        if family == socket.AF_INET6:
            raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol")
        return real(address, family=family, **kw)

    monkeypatch.setattr(http.socket, "create_server", no_ipv6)
    socks = listen_sockets("0.0.0.0", 0, 16)
    try:
        assert [s.family for s in socks] == [socket.AF_INET]
    finally:
        for s in socks:
            s.close()


@needs_ipv6
def test_a_port_taken_in_either_family_is_an_error() -> None:
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as taken:
        taken.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        taken.bind(("::", 0))
        taken.listen()
        port = taken.getsockname()[1]
        opened: list[socket.socket] = []
        real = socket.create_server

        def track(address: Any, **kw: Any) -> socket.socket:
            s = real(address, **kw)
            opened.append(s)
            return s

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(http.socket, "create_server", track)
            with pytest.raises(OSError) as e:
                listen_sockets("0.0.0.0", port, 16)
        assert e.value.errno == errno.EADDRINUSE
        assert opened and all(s.fileno() == -1 for s in opened)  # the IPv4 socket it opened first is closed
