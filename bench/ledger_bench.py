"""Ledger throughput against a real redis-server, next to what redis-benchmark gets from it.

Not a test: it asserts nothing about speed. It starts its own redis-server (no persistence), sets
up a cluster (default 50 nodes x 8 cards, half MTT S4000, half S5000) and measures, with 1, 2 and
4 client processes (each an extender-like replica: one Ledger, its own Mirror fed by Pub/Sub, many
coroutines):

* cycle: place + mark_bound + release of one pod, over and over (a steady scheduling loop);
* place: Ledger.place alone, filling the cluster up to a quota (then released, untimed).

Pods are slices of random valid sizes (2..32 units, 1..4 core groups), built by shared.domain.request.
Side by side, the ceiling: redis-benchmark sending a trivial EVALSHA (`return 1`, no key) to the
same server in the same run: `-n 200000` (a few seconds, enough for a stable rate), `-c 50`
connections (at least as many requests in flight as our clients keep, so the single-threaded
server never waits for a client), `-P 1` (no pipelining: the ledger sends each script as its own
round trip, one pod at a time) and the default single client thread (like ours, it shares the 2
cores with the server). That is the most script calls per second this server can dispatch here;
our scripts do real work (read ~10 keys, write, publish), so it bounds them from above.

Also reported: Redis round trips per scheduled pod (Ledger.round_trips over place + mark_bound;
release is the pod's deletion, not its scheduling), the server's time per script call (INFO
commandstats), CPU use of the server and the clients (2 cores are shared), and a breakdown of one
call at a time (server and client time per script kind, a mirror's time per feed message).

  python -m bench.ledger_bench                       # all of it, ~1 minute, writes bench/results/ledger.json
  python -m bench.ledger_bench --clients 1 --seconds 3 --profile   # pyinstrument on client process 0
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import random
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast

import orjson
import redis
from redis.asyncio import Redis

from bench.ledger_client import PLACE_SIZES, SIZES, client_main
from deploy.local.redis import RedisServer
from shared.domain.node import Card, Inventory
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror

RESULTS = Path(__file__).with_name("results") / "ledger.json"


def say(msg: str) -> None:
    print(msg, flush=True)


def inventories(nodes: int, cards: int) -> list[Inventory]:
    out = []
    for i in range(nodes):
        cap = 96 if i % 2 == 0 else 160
        name = f"bench-{'s4000' if cap == 96 else 's5000'}-{i:03d}"
        out.append(Inventory(name, tuple(Card(name, c, cap) for c in range(cards))))
    return out


# -- the parent ------------------------------------------------------------------------------------------

def server_stats(r: redis.Redis) -> dict[str, float]:
    # a sync client; redis-py 7 hints its calls as `Awaitable[Any] | Any` (one signature for both clients)
    info = cast(dict[str, Any], r.info("commandstats"))
    ev = info.get("cmdstat_evalsha", {})
    cpu = cast(dict[str, Any], r.info("cpu"))
    return {"evalsha_calls": float(ev.get("calls", 0)), "evalsha_usec": float(ev.get("usec", 0)),
            "cpu": float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])}


def aggregate_rate(outs: list[dict[str, Any]]) -> float:
    """The ledger's pods/s over all clients: their pods over the time they took together. The clients start
    together (one start event; in place mode a barrier before every round), and a round lasts until its
    slowest client is done, so the window is the sum over rounds of the slowest client's time (one round in
    cycle mode: the measured window every client shares)."""
    count = sum(o["count"] for o in outs)
    window = sum(max(ts) for ts in zip(*(o.get("round_elapsed") or [o["elapsed"]] for o in outs), strict=True))
    return count / window if window > 0 else 0.0


def run_clients(mode: str, url: str, n: int, coroutines: int, seconds: float, warmup: float, quota: int,
                rounds: int, seed: int, profile: bool) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    start = ctx.Event()
    barrier = ctx.Barrier(n)
    results = ctx.Queue()
    procs = [ctx.Process(target=client_main, args=(mode, url, w, coroutines, seconds, warmup, quota // n, rounds,
                                                   start, barrier, results, seed * 10 + w, profile), daemon=True)
             for w in range(n)]
    for p in procs:
        p.start()
    r = redis.Redis.from_url(url, decode_responses=True)
    # wait until every client's mirror subscribed (their PUBSUB NUMSUB count), then start them together
    deadline = time.monotonic() + 60
    while int(dict(cast(list[tuple[str, int]], r.pubsub_numsub("mt:feed"))).get("mt:feed", 0)) < n:
        if time.monotonic() > deadline:
            raise RuntimeError("clients did not start")
        time.sleep(0.05)
    time.sleep(0.3)
    r.config_resetstat()
    before = server_stats(r)
    t0 = time.monotonic()
    start.set()
    outs = [results.get(timeout=seconds + warmup + 300) for _ in procs]
    wall = time.monotonic() - t0
    after = server_stats(r)
    for p in procs:
        p.join(30)
    r.close()
    count = sum(o["count"] for o in outs)
    rate = aggregate_rate(outs)
    calls = after["evalsha_calls"] - before["evalsha_calls"]
    sched = count
    place_trips = sum(o["place_round_trips"] for o in outs)
    refetch = sum(o["mirror_refetches"] for o in outs)
    # per scheduled pod: place (with any conflict retries) + mark_bound + mirror refetches it caused
    per_pod = ((place_trips + (count if mode == "cycle" else 0) + refetch) / sched) if sched else 0.0
    return {
        "mode": mode, "clients": n, "coroutines_per_client": coroutines, "pods": count,
        "rate_per_s": rate, "wall_s": wall,
        # what rate_per_s was before 2026-12-06 (bench/results/ledger.json of 2026-11-29): each client's own
        # rate added up, which overstates the whole when the clients finish a round apart
        "sum_of_client_rates_per_s": sum(o["count"] / o["elapsed"] for o in outs if o["elapsed"] > 0),
        "round_trips_per_scheduled_pod": per_pod,
        "round_trips_total_per_pod": (sum(o["round_trips"] for o in outs) / count) if count else 0.0,
        "conflicts": sum(o["conflicts"] for o in outs), "refused": sum(o["refused"] for o in outs),
        "mirror_refetches": refetch, "mirror_applied": sum(o["mirror_applied"] for o in outs),
        "place_p50_ms": statistics.median(o["place_p50_ms"] for o in outs),
        "place_p99_ms": max(o["place_p99_ms"] for o in outs),
        "server_usec_per_script": ((after["evalsha_usec"] - before["evalsha_usec"]) / calls) if calls else 0.0,
        "server_cpu_pct": 100 * (after["cpu"] - before["cpu"]) / wall,
        "clients_cpu_pct": 100 * sum(o["cpu_seconds"] for o in outs) / max(o["elapsed"] for o in outs),
        "profiles": [o["profile"] for o in outs if "profile" in o],
    }


def ceiling(server: RedisServer, requests_n: int, connections: int) -> dict[str, Any]:
    """redis-benchmark's rate for a trivial EVALSHA on the same server."""
    exe = shutil.which("redis-benchmark")
    if not exe:
        raise RuntimeError("redis-benchmark not found: it comes with redis-server (Debian package redis-tools)")
    r = redis.Redis(port=server.port, decode_responses=True)
    sha = str(r.script_load("return 1"))
    r.config_resetstat()
    cmd = [exe, "-h", "127.0.0.1", "-p", str(server.port), "-n", str(requests_n), "-c", str(connections), "-P", "1",
           "--csv", "EVALSHA", sha, "0"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=300).stdout
    usec = float(cast(dict[str, Any], r.info("commandstats")).get("cmdstat_evalsha", {}).get("usec_per_call", 0.0))
    r.close()
    rows = [line for line in out.splitlines() if line.startswith('"EVALSHA')]
    if not rows:
        raise RuntimeError(f"cannot read redis-benchmark's output:\n{out}")
    fields = [f.strip('"') for f in rows[-1].split('","')]
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.strip()
    return {"command": " ".join([*cmd[:-2], "<sha of 'return 1'>", "0"]), "rate_per_s": float(fields[1]),
            "p50_ms": float(fields[4]) if len(fields) > 4 else None, "server_usec_per_script": usec,
            "version": version}


async def breakdown(url: str, invs: list[Inventory], n: int = 2000) -> dict[str, float]:
    """Where a cycle's time goes, one call at a time (no concurrency): the server's time per script
    (INFO commandstats, per script kind), the client's wall time per call (Python + redis-py + the
    round trip + the server's time), and a mirror's time to apply one feed message."""
    r = Redis.from_url(url, decode_responses=True)
    ledger = Ledger(r)
    await ledger.load_scripts()
    rng = random.Random(5)
    jobs = [(invs[rng.randrange(len(invs))].node, f"bd-{i}", rng.randrange(len(invs[0].cards))) for i in range(n)]
    out: dict[str, float] = {}
    sub = r.pubsub()
    await sub.subscribe("mt:feed")
    for name, call in (("reserve", lambda j: ledger.reserve(j[0], j[1], [j[2]], 2, 1, 1)),
                       ("mark_bound", lambda j: ledger.mark_bound(j[0], j[1])),
                       ("release", lambda j: ledger.release(j[0], j[1])),
                       ("snapshot", lambda j: ledger.snapshot(j[0]))):
        await r.config_resetstat()
        t0 = time.perf_counter()
        for j in jobs:
            await call(j)
        out[f"client_us_per_{name}"] = 1e6 * (time.perf_counter() - t0) / n
        stats = await r.info("commandstats")
        out[f"server_us_per_{name}"] = float(stats["cmdstat_evalsha"]["usec_per_call"])
    # the mirror's share of every change, on every replica: applying one feed message (the message
    # of a reserve; taking it off the socket costs about as much again in redis-py)
    while await sub.get_message(ignore_subscribe_messages=True, timeout=0.2) is not None:
        pass
    mirror = Mirror(ledger)
    await mirror.resync()
    node = invs[0].node
    await ledger.reserve(node, "bd-msg", [0], 2, 1, 1)
    raw = None
    while raw is None:
        msg = await sub.get_message(ignore_subscribe_messages=True, timeout=1.0)
        if msg is not None and "bd-msg" in str(msg["data"]):
            raw = msg["data"]
    t0 = time.perf_counter()
    for _ in range(n):
        data = orjson.loads(raw)
        data["version"] = mirror.nodes[node].version + 1
        mirror.apply(data)
    out["client_us_per_feed_message_apply"] = 1e6 * (time.perf_counter() - t0) / n
    await ledger.release(node, "bd-msg")
    await sub.aclose()  # type: ignore[no-untyped-call]
    await r.aclose()
    return out


async def setup(url: str, invs: list[Inventory]) -> None:
    r = Redis.from_url(url, decode_responses=True)
    await r.flushall()
    ledger = Ledger(r)
    await ledger.load_scripts()
    for inv in invs:
        await ledger.upsert_node(inv)
    await r.aclose()


async def leftovers(url: str) -> int:
    r = Redis.from_url(url, decode_responses=True)
    ledger = Ledger(r)
    snaps = await ledger.snapshots(await ledger.nodes())
    await r.aclose()
    return sum(len(s.reservations) for s in snaps.values()) + sum(
        c.mem_used + c.cores_used + c.slices for s in snaps.values() for c in s.cards.values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--cards", type=int, default=8)
    ap.add_argument("--clients", default="1,2,4", help="client process counts, comma separated")
    ap.add_argument("--coroutines", type=int, default=32, help="concurrent pods per client process")
    ap.add_argument("--seconds", type=float, default=5.0, help="measured time of each cycle run")
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--quota", type=int, default=0, help="pods placed per place-only run (default: 60%% of "
                                                          "the slices the cluster has room for)")
    ap.add_argument("--rounds", type=int, default=4, help="place-only: fill and empty the cluster this often")
    ap.add_argument("--bench-requests", type=int, default=200_000)
    ap.add_argument("--bench-connections", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--profile", action="store_true", help="pyinstrument on client process 0 (pip install "
                                                            "pyinstrument); text written next to the results")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    clients = [int(c) for c in args.clients.split(",") if c]
    quota = args.quota or int(args.nodes * args.cards * 16 * 0.6)
    invs = inventories(args.nodes, args.cards)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)

    say(f"ledger bench: {args.nodes} nodes x {args.cards} cards, client processes {clients}, "
        f"{args.coroutines} coroutines each, {os.cpu_count()} CPUs")
    load_start = os.getloadavg()
    server = RedisServer().start()
    say(f"redis-server on port {server.port} ({server.workdir}); load average {load_start[0]:.2f} (other "
        "processes on this machine take CPU from the run)")
    runs: list[dict[str, Any]] = []
    try:
        asyncio.run(setup(server.url, invs))
        say(f"ceiling: redis-benchmark -n {args.bench_requests} -c {args.bench_connections} -P 1 EVALSHA "
            "<return 1> 0 ...")
        ceil = ceiling(server, args.bench_requests, args.bench_connections)
        say(f"  {ceil['rate_per_s']:,.0f} calls/s (server {ceil['server_usec_per_script']:.2f} us per call)")
        say("breakdown: one call at a time ...")
        costs = asyncio.run(breakdown(server.url, invs))
        say("  " + ", ".join(f"{k} {v:.1f}" for k, v in costs.items()))
        for mode in ("cycle", "place"):
            for n in clients:
                say(f"{mode}: {n} client process(es) x {args.coroutines} coroutines ...")
                res = run_clients(mode, server.url, n, args.coroutines, args.seconds, args.warmup, quota,
                                  args.rounds, args.seed, args.profile)
                left = asyncio.run(leftovers(server.url))
                res["leftover_usage_after_release"] = left
                runs.append(res)
                say(f"  {res['rate_per_s']:,.0f} pods/s, {res['round_trips_per_scheduled_pod']:.2f} round trips "
                    f"per scheduled pod, {res['conflicts']} conflicts, server {res['server_usec_per_script']:.1f} us"
                    f"/script at {res['server_cpu_pct']:.0f}% CPU, clients {res['clients_cpu_pct']:.0f}% CPU"
                    + (f"; LEFT OVER {left}" if left else ""))
    finally:
        server.stop()

    say("")
    say(f"{'mode':<7}{'clients':>8}{'pods/s':>10}{'x ceiling':>11}{'trips/pod':>11}{'conflicts':>11}"
        f"{'p50 ms':>8}{'p99 ms':>8}{'srv us/call':>13}{'srv CPU':>9}{'cli CPU':>9}")
    for r in runs:
        say(f"{r['mode']:<7}{r['clients']:>8}{r['rate_per_s']:>10,.0f}{r['rate_per_s'] / ceil['rate_per_s']:>11.3f}"
            f"{r['round_trips_per_scheduled_pod']:>11.2f}{r['conflicts']:>11}{r['place_p50_ms']:>8.2f}"
            f"{r['place_p99_ms']:>8.2f}{r['server_usec_per_script']:>13.1f}{r['server_cpu_pct']:>8.0f}%"
            f"{r['clients_cpu_pct']:>8.0f}%")
    say(f"{'ceiling':<7}{'':>8}{ceil['rate_per_s']:>10,.0f}{1.0:>11.3f}{1:>11.2f}{'':>11}"
        f"{ceil['p50_ms'] or 0:>8.2f}{'':>8}{ceil['server_usec_per_script']:>13.2f}")
    report = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0], "platform": platform.platform(),
                    "loadavg_1m_start_end": [round(load_start[0], 2), round(os.getloadavg()[0], 2)],
                    "redis": re.sub(r"\s+", " ", subprocess.run(["redis-server", "--version"], capture_output=True,
                                                                 text=True).stdout.strip())},
        "setup": {"nodes": args.nodes, "cards_per_node": args.cards, "coroutines_per_client": args.coroutines,
                  "seconds": args.seconds, "warmup": args.warmup, "place_quota": quota, "place_rounds": args.rounds,
                  "cycle_pods": {"units": list(SIZES), "cores": [1, 4]},
                  "place_pods": {"units": list(PLACE_SIZES), "cores": [1, 1]}},
        "ceiling": ceil,
        "breakdown_us": costs,
        "runs": runs,
        "best_ratio_to_ceiling": max(r["rate_per_s"] for r in runs) / ceil["rate_per_s"] if runs else 0.0,
    }
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    say(f"\nwritten: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
