"""What one HTTPS request costs the serving process, by how its client uses connections.

Each server variant runs in its own child process on the product's serving path
(shared.serving.http.serve with a CertReloader context and the extender's mutual-TLS policy, as the
harness configures it); it reads a filter-sized JSON body and answers a small JSON reply, as the
extender's filter does with filterTopK=1. The parent is the client (ECDSA P-256 PKI from
deploy/local/pki.py, a client certificate, ALPN h2 + http/1.1 as Go offers) and drives requests:

  keepalive  8 concurrent callers, each reusing its own connection
  fresh      8 concurrent callers, a new TLS connection for every request
  gopool     8 concurrent callers sharing an idle pool of 2 connections (Go's MaxIdleConnsPerHost
             default, as kube-scheduler's extender client has it): a caller takes an idle connection
             or dials one, and closes it afterwards when 2 are idle already; each caller waits a
             random 20 ms (mean) between requests and the server holds each one 20 ms, as binds
             waiting on the API server do, so 0 to 8 are in flight

The figure is the server process's CPU (all threads, /proc/<pid>/task/*/schedstat) per request.
All variants run at once and are measured in interleaved rounds, so a busy machine skews them alike:
compare the ratios within one run, not absolute numbers across runs. A second table splits CPU and
wall time inside the handshake, the response write and getpeercert() (probes in the server).

  python -m bench.tls_micro [--requests 600] [--rounds 3] [--variants old-uvloop,product-uvloop]
                            [--modes keepalive,fresh,gopool] [--hogs N]

Variants: `<context>-<loop>[+tweak...]`, context `old` (the SSLContext before the per-request-cost
change) or `product` (shared.serving.tls.CertReloader today), loop `uvloop` or `asyncio`; tweaks:
`tickets2` (2 TLS 1.3 session tickets per handshake, OpenSSL's default), `tickets0` (none, and
no TLS 1.2 ticket either), `p256` (ECDHE on P-256 only); for reference only, not product settings:
`noverify` (no client certificate asked), `plain` (no TLS at all).
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import json
import os
import random
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

MODES = ("keepalive", "fresh", "gopool")
CONCURRENCY = 8
IDLE_PER_HOST = 2
HOLD = 0.02  # s a bind takes server-side in gopool (waiting on the API server)
REPLY = {"NodeNames": ["node-0417"], "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": ""}


def old_context(cert: str, key: str) -> ssl.SSLContext:
    """The serving context before this benchmark's findings (kept here to compare against)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    return ctx


# -- server (child process) -------------------------------------------------------------------------

# CPU and wall time inside the places the extender's py-spy profile named (what a sampling profiler that
# counts runnable threads sees is wall time: a write that wakes the caller can be preempted); each holds
# [calls, cpu ns, wall ns]
SPLIT: dict[str, list[int]] = {"handshake": [0, 0, 0], "response write": [0, 0, 0], "peer cert": [0, 0, 0]}


def _probe(owner: type, name: str, what: str) -> None:
    plain = getattr(owner, name)
    acc = SPLIT[what]

    def timed(*args: object) -> object:
        cpu, wall = time.thread_time_ns(), time.perf_counter_ns()
        try:
            return plain(*args)
        finally:
            acc[0] += 1
            acc[1] += time.thread_time_ns() - cpu
            acc[2] += time.perf_counter_ns() - wall

    setattr(owner, name, timed)


def install_probes() -> None:
    from aiohttp import http_writer

    _probe(ssl.SSLObject, "do_handshake", "handshake")  # called again after each WANT_READ
    _probe(http_writer.StreamWriter, "_writelines", "response write")  # headers + body, one transport.write
    _probe(ssl.SSLObject, "getpeercert", "peer cert")  # the event loop decodes it after each handshake


async def _serve(variant: str, pki: Path, port: int, stop: asyncio.Event) -> None:
    from shared.serving.http import serve
    from shared.serving.listen import LISTEN_POLICY, ListenPolicy
    from shared.serving.tls import CertReloader

    context_name, *tweaks = variant.split("-", 1)[0], *variant.split("+")[1:]
    cert, key = str(pki / "serving.crt"), str(pki / "serving.key")
    ctx = old_context(cert, key) if context_name == "old" else CertReloader(cert, key).context
    if "tickets2" in tweaks:
        ctx.num_tickets = 2
    if "tickets0" in tweaks:
        ctx.num_tickets = 0
        ctx.options |= ssl.OP_NO_TICKET
    if "p256" in tweaks:
        ctx.set_ecdh_curve("prime256v1")

    async def filter_(request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        reply = dict(REPLY, NodeNames=body["NodeNames"][:1])
        return web.Response(body=json.dumps(reply).encode(), content_type="application/json")

    async def bind(request: web.Request) -> web.Response:
        await request.read()
        await asyncio.sleep(HOLD)  # the API server's Binding round trip: binds overlap, as in a burst
        return web.Response(body=b"{}", content_type="application/json")

    app = web.Application()
    app.router.add_post("/filter", filter_)
    app.router.add_post("/bind", bind)
    client_ca = "" if "noverify" in tweaks or "plain" in tweaks else str(pki / "ca.crt")
    app[LISTEN_POLICY] = ListenPolicy("extender", "127.0.0.1:0", client_ca)
    runner = await serve(app, f"127.0.0.1:{port}", None if "plain" in tweaks else ctx)
    print("ready", flush=True)
    await stop.wait()
    await runner.cleanup()


def server_main(variant: str, pki: Path, port: int) -> None:
    install_probes()
    atexit.register(lambda: print(json.dumps(SPLIT), flush=True))
    async def run() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_reader(sys.stdin.fileno(), stop.set)  # parent closes stdin: stop
        await _serve(variant, pki, port, stop)

    if variant.split("+")[0].endswith("-uvloop"):
        import uvloop
        uvloop.run(run())
    else:
        asyncio.run(run())


# -- client (this process) --------------------------------------------------------------------------

def _body(nodes: int = 100) -> bytes:
    pod = {"metadata": {"name": "bench-pod", "namespace": "default", "uid": "0" * 36,
                        "annotations": {"mthreads.com/sgpu-request": '{"cards":1,"memory":8}'}},
           "spec": {"containers": [{"name": "c", "image": "busybox",
                                    "resources": {"limits": {"mthreads.com/sgpu-memory": "8"}}}]}}
    return json.dumps({"Pod": pod, "NodeNames": [f"node-{i:04}" for i in range(nodes)]}).encode()


BODY = _body()


def _request(path: str) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: Go-http-client/1.1\r\n"
            f"Content-Type: application/json\r\nAccept-Encoding: gzip\r\nContent-Length: {len(BODY)}\r\n\r\n"
            ).encode() + BODY


FILTER, BIND = _request("/filter"), _request("/bind")

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _roundtrip(conn: Conn, request: bytes) -> None:
    reader, writer = conn
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"server answered {head[:40]!r}")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    await reader.readexactly(length)


@dataclass
class Dialer:
    port: int
    ctx: ssl.SSLContext | None
    dials: int = 0

    async def dial(self) -> Conn:
        self.dials += 1
        return await asyncio.open_connection("127.0.0.1", self.port, ssl=self.ctx,
                                             server_hostname="localhost" if self.ctx else None)


async def _close(conn: Conn) -> None:
    conn[1].close()
    with contextlib.suppress(ConnectionError, ssl.SSLError):
        await conn[1].wait_closed()


@dataclass
class Pool:
    """Go's http.Transport idle pool, reduced to what matters here: at most `idle` kept."""
    dialer: Dialer
    idle: int
    free: list[Conn] = field(default_factory=list)

    async def get(self) -> Conn:
        return self.free.pop() if self.free else await self.dialer.dial()

    async def put(self, conn: Conn) -> None:
        if len(self.free) < self.idle:
            self.free.append(conn)
        else:
            await _close(conn)


async def drive(mode: str, dialer: Dialer, requests: int) -> None:
    left = requests

    def take() -> bool:
        nonlocal left
        left -= 1
        return left >= 0

    pool = Pool(dialer, IDLE_PER_HOST if mode == "gopool" else CONCURRENCY)
    rng = random.Random(1)

    async def caller() -> None:
        while take():
            if mode == "gopool":  # binds come as the scheduling loop makes them: in flight 0..8
                await asyncio.sleep(rng.expovariate(1 / HOLD))
            conn = await pool.get()
            await _roundtrip(conn, BIND if mode == "gopool" else FILTER)
            if mode == "fresh":
                await _close(conn)
            else:
                await pool.put(conn)

    await asyncio.gather(*(caller() for _ in range(CONCURRENCY)))
    for conn in pool.free:
        await _close(conn)


def cpu_ns(pid: int) -> int:
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/schedstat") as f:
            total += int(f.read().split()[0])
    return total


@dataclass
class Server:
    variant: str
    proc: subprocess.Popen[str]
    port: int
    cpu: dict[str, int] = field(default_factory=dict)
    dials: dict[str, int] = field(default_factory=dict)
    warm_dials: int = 0
    split: dict[str, list[int]] = field(default_factory=dict)

    def client(self, ctx: ssl.SSLContext) -> ssl.SSLContext | None:
        return None if "+plain" in self.variant else ctx

    def stop(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        out = self.proc.stdout.read().strip().splitlines()
        self.proc.wait(10)
        if out:
            self.split = json.loads(out[-1])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(variant: str, pki: Path) -> Server:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "bench.tls_micro", "--serve", variant, "--pki", str(pki),
                             "--port", str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        raise RuntimeError(f"server {variant} did not start")
    return Server(variant, proc, port)


def client_context(pki: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    ctx.load_cert_chain(str(pki / "client.crt"), str(pki / "client.key"))
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    return ctx


async def measure(servers: list[Server], modes: list[str], requests: int, rounds: int, pki: Path) -> None:
    ctx = client_context(pki)
    for s in servers:  # warm up: imports, first handshake, caches
        warm = Dialer(s.port, s.client(ctx))
        await drive("fresh", warm, 50)
        s.warm_dials = warm.dials
    for _ in range(rounds):
        for mode in modes:
            for s in servers:
                dialer = Dialer(s.port, s.client(ctx))
                before = cpu_ns(s.proc.pid)
                await drive(mode, dialer, requests)
                s.cpu[mode] = s.cpu.get(mode, 0) + cpu_ns(s.proc.pid) - before
                s.dials[mode] = s.dials.get(mode, 0) + dialer.dials


def report(servers: list[Server], modes: list[str], requests: int, rounds: int) -> str:
    n = requests * rounds
    base = servers[0]
    head = f"{'server CPU us/request':<34}" + "".join(f"{m:>22}" for m in modes)
    lines = [head]
    for s in servers:
        cells = []
        for m in modes:
            us = s.cpu[m] / n / 1000
            cells.append(f"{us:8.0f} ({s.cpu[m] / base.cpu[m]:4.2f}x) {s.dials[m] / n:4.2f}d")
        lines.append(f"{s.variant:<34}" + "".join(f"{c:>22}" for c in cells))
    lines.append(f"({n} requests per cell, {CONCURRENCY} concurrent; x = ratio to the first row; "
                 "d = new TLS connections per request)")
    return "\n".join(lines)


def report_split(servers: list[Server], requests: int) -> str:
    """CPU and wall time inside the handshake (per new connection) and the response write (per response)."""
    lines = [f"{'inside, us (cpu / wall)':<34}{'handshake per connection':>28}{'response write':>22}"
             f"{'getpeercert':>18}"]
    for s in servers:
        if not s.split:
            continue
        conns = s.warm_dials + sum(s.dials.values())
        _, hs_cpu, hs_wall = s.split["handshake"]
        writes, w_cpu, w_wall = s.split["response write"]
        _, p_cpu, p_wall = s.split["peer cert"]
        lines.append(f"{s.variant:<34}{hs_cpu / conns / 1e3:>14.0f} / {hs_wall / conns / 1e3:<11.0f}"
                     f"{w_cpu / max(writes, 1) / 1e3:>10.0f} / {w_wall / max(writes, 1) / 1e3:<9.0f}"
                     f"{p_cpu / conns / 1e3:>8.0f} / {p_wall / conns / 1e3:<7.0f}")
    lines.append("(wall above cpu: the process was runnable but not running, which a sampling profiler "
                 "such as py-spy counts as time spent there)")
    return "\n".join(lines)


def hogs(n: int) -> list[subprocess.Popen[bytes]]:
    """CPU-bound processes, to see the costs on a saturated machine (as during a scheduling burst)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=600, help="requests per mode, variant and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--variants", default="old-uvloop,product-uvloop,old-asyncio,product-asyncio")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--hogs", type=int, default=0, help="CPU-bound processes running beside (default 0)")
    p.add_argument("--serve", help=argparse.SUPPRESS)
    p.add_argument("--pki", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.serve:
        server_main(a.serve, Path(a.pki), a.port)
        return 0
    import uvloop

    from deploy.local.pki import write_pki

    modes = a.modes.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        write_pki(tmp)
        servers = [start(v, Path(tmp)) for v in a.variants.split(",")]
        burners = hogs(a.hogs)
        try:
            t0 = time.monotonic()
            uvloop.run(measure(servers, modes, a.requests, a.rounds, Path(tmp)))
            print(report(servers, modes, a.requests, a.rounds))
            print(f"({time.monotonic() - t0:.0f} s, {a.hogs} CPU hogs beside)")
        finally:
            for b in burners:
                b.kill()
                b.wait()
            for s in servers:
                s.stop()
        print(report_split(servers, a.requests))
    return 0


if __name__ == "__main__":
    sys.exit(main())
