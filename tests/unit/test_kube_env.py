"""The API client reads the proxy environment once (shared/kube.py `_read_env_once`): kubernetes-asyncio's
session would look up the proxy variables and ~/.netrc in a worker thread on every request. Real HTTP on
loopback: a stand-in API server and a stand-in forward proxy that answers for it and notes what it saw."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from shared.kube import Kube
from tests.kubeconfigs import token_kubeconfig

_PROXY_ENV = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy",
              "no_proxy", "NETRC")


async def _serve(handler: web.RequestHandler) -> tuple[web.AppRunner, int]:  # type: ignore[type-arg]
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


@pytest.fixture
async def servers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> AsyncIterator[dict[str, object]]:
    for var in _PROXY_ENV:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc unless a test writes one
    seen: dict[str, object] = {"proxied": []}

    async def api(req: web.Request) -> web.Response:
        return web.json_response({"from": "api"})

    async def proxy(req: web.Request) -> web.Response:
        seen["proxied"].append((str(req.url), req.headers.get("Proxy-Authorization")))  # type: ignore[attr-defined]
        return web.json_response({"from": "proxy"})

    api_runner, api_port = await _serve(api)
    proxy_runner, proxy_port = await _serve(proxy)
    kubeconfig = token_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{api_port}")
    # the same server as https:// (a proxy tunnels it with CONNECT)
    https = token_kubeconfig(tmp_path / "kubeconfig-https", f"https://127.0.0.1:{api_port}", insecure=True)
    seen.update(kubeconfig=str(kubeconfig), kubeconfig_https=str(https), api_port=api_port,
                proxy=f"http://127.0.0.1:{proxy_port}")
    yield seen
    await api_runner.cleanup()
    await proxy_runner.cleanup()


async def _get(seen: dict[str, object]) -> tuple[object, bool]:
    kube = await Kube.create(str(seen["kubeconfig"]))
    try:
        body = await kube.request("GET", "/api/v1/namespaces")
        return body["from"], kube.api.rest_client.pool_manager.trust_env
    finally:
        await kube.close()


async def test_without_proxy_variables_requests_go_straight_and_nothing_is_looked_up(
        servers: dict[str, object]) -> None:
    assert await _get(servers) == ("api", False)


async def test_a_proxy_variable_is_followed_and_looked_up_once(servers: dict[str, object],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", str(servers["proxy"]))
    assert await _get(servers) == ("proxy", False)
    assert servers["proxied"] == [(f"http://127.0.0.1:{servers['api_port']}/api/v1/namespaces", None)]


async def test_the_proxys_credentials_are_sent_to_it(servers: dict[str, object],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("http_proxy", str(servers["proxy"]).replace("http://", "http://u%40x:p%3Aw@"))
    assert await _get(servers) == ("proxy", False)
    want = "Basic " + base64.b64encode(b"u@x:p:w").decode()
    assert servers["proxied"] == [(f"http://127.0.0.1:{servers['api_port']}/api/v1/namespaces", want)]


async def test_no_proxy_naming_the_api_server_goes_straight(servers: dict[str, object],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", str(servers["proxy"]))
    monkeypatch.setenv("NO_PROXY", "10.0.0.0/8,127.0.0.1")
    assert await _get(servers) == ("api", False)
    assert servers["proxied"] == []


async def test_a_netrc_file_keeps_the_per_request_lookups(servers: dict[str, object], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / ".netrc").write_text("machine example.invalid login a password b\n")
    monkeypatch.setenv("HTTP_PROXY", str(servers["proxy"]))
    assert await _get(servers) == ("proxy", True)


async def _refusing_proxy(heads: list[bytes]) -> tuple[asyncio.Server, int]:
    """A forward proxy on loopback that notes each request's head and answers 407."""

    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(refuse, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_an_https_api_server_is_tunnelled_with_the_proxys_credentials(
        servers: dict[str, object], monkeypatch: pytest.MonkeyPatch) -> None:
    heads: list[bytes] = []
    server, port = await _refusing_proxy(heads)
    monkeypatch.setenv("HTTPS_PROXY", f"http://u:p@127.0.0.1:{port}")
    kube = await Kube.create(str(servers["kubeconfig_https"]))
    try:
        with pytest.raises(aiohttp.ClientHttpProxyError):
            await kube.request("GET", "/api/v1/namespaces")
        assert not kube.api.rest_client.pool_manager.trust_env
    finally:
        await kube.close()
        server.close()
        await server.wait_closed()
    head = heads[0].decode()
    assert head.startswith(f"CONNECT 127.0.0.1:{servers['api_port']} "), head
    assert "Proxy-Authorization: Basic " + base64.b64encode(b"u:p").decode() in head, head


async def test_the_proxys_credentials_stay_out_of_error_messages(
        servers: dict[str, object], monkeypatch: pytest.MonkeyPatch) -> None:
    """A proxy's refusal is logged and shown in /readyz (the watcher's rebuild check): the password it was
    given must not be in the message, as it is not when aiohttp reads the environment itself."""
    server, port = await _refusing_proxy([])
    monkeypatch.setenv("HTTPS_PROXY", f"http://u:s3cret@127.0.0.1:{port}")
    kube = await Kube.create(str(servers["kubeconfig_https"]))
    try:
        with pytest.raises(aiohttp.ClientHttpProxyError) as raised:
            await kube.request("GET", "/api/v1/namespaces")
    finally:
        await kube.close()
        server.close()
        await server.wait_closed()
    assert "s3cret" not in str(raised.value) and "s3cret" not in repr(raised.value), raised.value


@pytest.mark.parametrize("no_proxy", ["10.96.0.0/12, 127.0.0.0/8", "127.0.0.1/32", "::1/128,127.0.0.0/24"])
async def test_a_no_proxy_cidr_holding_the_api_server_goes_straight(servers: dict[str, object], no_proxy: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # Go's clients match CIDR entries (the usual way to exempt a service network); Python's lookup does not
    monkeypatch.setenv("HTTP_PROXY", str(servers["proxy"]))
    monkeypatch.setenv("NO_PROXY", no_proxy)
    assert await _get(servers) == ("api", False)
    assert servers["proxied"] == []


@pytest.mark.parametrize("no_proxy", ["10.96.0.0/12", "127.0.0.2/32", "not a cidr,*.example", "::/0"])
async def test_a_no_proxy_cidr_not_holding_it_keeps_the_proxy(servers: dict[str, object], no_proxy: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", str(servers["proxy"]))
    monkeypatch.setenv("NO_PROXY", no_proxy)
    assert await _get(servers) == ("proxy", False)


@pytest.mark.parametrize("upper", ["127.0.0.1", "127.0.0.0/8"])
async def test_an_empty_no_proxy_outranks_no_proxy_for_cidrs_as_for_names(servers: dict[str, object], upper: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # Python's lookup prefers the lowercase variable, set even if empty (urllib's getproxies_environment):
    # the CIDR match reads the same one, so an address and a CIDR holding it get the same answer
    monkeypatch.setenv("HTTP_PROXY", str(servers["proxy"]))
    monkeypatch.setenv("no_proxy", "")
    monkeypatch.setenv("NO_PROXY", upper)
    assert await _get(servers) == ("proxy", False)
