"""A per-request random HTTPS load balancer for replicas on one machine (tests, quick start, bench).

kube-scheduler and kube-apiserver call one URL; a Kubernetes Service would spread calls over
replicas. This stands in for it, picking a random replica for every request (not per connection,
so keep-alive does not pin a caller to one replica): the routing the ledger must be safe under.

  python -m deploy.local.balancer --listen 127.0.0.1:PORT --cert C --key K --ca CA --backend URL ...

With --client-ca it takes only callers of that CA and, with --client-name, only those whose certificate
names one of them (403 otherwise), as the replicas would: it calls them with its own --client-cert, the
one name they admit, so a caller it let through would get that name.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import ssl

import aiohttp
import uvloop
from aiohttp import web

from shared.serving.http import listen_sockets, split_addr
from shared.serving.listen import client_name_middleware


def make_app(backends: list[str], ca: str, client_cert: str = "", client_key: str = "",
             client_names: tuple[str, ...] = ()) -> web.Application:
    client_ctx = ssl.create_default_context(cafile=ca)
    if client_cert:  # the backends require a client certificate (the extender's mTLS)
        client_ctx.load_cert_chain(client_cert, client_key)
    session: dict[str, aiohttp.ClientSession] = {}
    counts = dict.fromkeys(backends, 0)

    async def on_startup(_: web.Application) -> None:
        session["s"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_ctx, limit=256),
                                             timeout=aiohttp.ClientTimeout(total=60))

    async def on_cleanup(_: web.Application) -> None:
        await session["s"].close()

    async def forward(request: web.Request) -> web.Response:
        body = await request.read()
        for backend in random.sample(backends, len(backends)):  # next replica if one is down
            try:
                async with session["s"].request(request.method, backend + request.rel_url.path_qs, data=body,
                                                headers={"Content-Type": request.content_type}) as resp:
                    counts[backend] += 1
                    return web.Response(body=await resp.read(), status=resp.status,
                                        content_type=resp.content_type)
            except aiohttp.ClientConnectionError:
                continue
        return web.Response(status=502, text="no replica reachable")

    async def stats(_: web.Request) -> web.Response:
        return web.json_response(counts)

    app = web.Application(client_max_size=64 * 1024 * 1024,
                          middlewares=[client_name_middleware("balancer", client_names)] if client_names else [])
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    app.router.add_get("/_balancer/stats", stats)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--listen", required=True)
    p.add_argument("--cert", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--ca", required=True)
    p.add_argument("--backend", action="append", required=True)
    p.add_argument("--client-ca", default="", help="require callers' client certificates signed by this CA")
    p.add_argument("--client-name", action="append", default=[],
                   help="with --client-ca: admit only callers whose certificate names this (CN or DNS SAN)")
    p.add_argument("--client-cert", default="", help="present this client certificate to the backends")
    p.add_argument("--client-key", default="")
    a = p.parse_args()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(a.cert, a.key)
    if a.client_ca:
        ctx.load_verify_locations(cafile=a.client_ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    host, port = split_addr(a.listen)  # "[::1]:PORT" too; 0.0.0.0 is both families, as the roles read it

    async def serve() -> None:
        runner = web.AppRunner(make_app(a.backend, a.ca, a.client_cert, a.client_key,
                                           tuple(a.client_name)), access_log=None)
        await runner.setup()
        for sock in listen_sockets(host, port, 1024):
            await web.SockSite(runner, sock, ssl_context=ctx, backlog=1024).start()
        await asyncio.Event().wait()

    uvloop.run(serve())


if __name__ == "__main__":
    main()
