"""One client process of bench/ledger_bench.py: an extender-like replica (one Ledger, its own Mirror fed
by Pub/Sub, many coroutines) placing pods of random valid slice sizes; reports its counts and latency."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from shared.config import Config
from shared.domain.models import CardModel
from shared.domain.request import SliceRequest, pod_request
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from shared.store.placing import place

PROFILES = Path(__file__).with_name("results")  # --profile writes profile-ledger-<mode>.txt here
CFG = Config(memory_per_card=(CardModel(96), CardModel(160)))
SIZES = (2, 4, 8, 16, 32)  # valid slice sizes on both card models
PLACE_SIZES = (2, 4, 8)


def requests(rng: random.Random, n: int = 64, sizes: tuple[int, ...] = SIZES,
             cores: tuple[int, int] = (1, 4)) -> list[SliceRequest]:
    out = []
    for _ in range(n):
        pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "resources": {"limits": {
            "mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": str(rng.choice(sizes)),
            "mthreads.com/sgpu-core": str(rng.randint(*cores))}}}]}}
        req = pod_request(pod, CFG)
        assert req is not None
        out.append(req)
    return out


async def client(mode: str, url: str, worker: int, coroutines: int, seconds: float, warmup: float,
                 quota: int, rounds: int, start: Any, barrier: Any, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    # place-only fills the cluster: small pods (1 core group, 2..8 units), so the quota fits
    reqs = requests(rng) if mode == "cycle" else requests(rng, sizes=PLACE_SIZES, cores=(1, 1))
    conn = Redis.from_url(url, decode_responses=True, max_connections=coroutines + 4)
    sub = Redis.from_url(url, decode_responses=True)
    ledger = Ledger(conn)
    await ledger.load_scripts()
    mirror = Mirror(ledger, subscriber=sub)
    await mirror.start()
    await asyncio.wait_for(mirror.ready.wait(), 30)
    nodes = sorted(mirror.nodes)
    await asyncio.to_thread(start.wait)  # every process is ready: go together

    count = 0
    refused = 0
    conflicts = 0
    place_trips = 0
    latencies: list[float] = []
    placed: list[tuple[str, str]] = []
    measuring = False
    loop = asyncio.get_running_loop()
    t_start = loop.time()
    t_measure = t_start + warmup
    t_end = t_measure + seconds
    uid_seq = 0

    async def place_somewhere(r: random.Random) -> tuple[str, str] | None:
        nonlocal uid_seq, refused, conflicts, place_trips
        uid_seq += 1
        uid = f"b{worker}-{uid_seq}"
        req = reqs[r.randrange(len(reqs))]
        for _ in range(8):
            node = nodes[r.randrange(len(nodes))]
            t0 = time.perf_counter()
            out, _ = await place(ledger, node, uid, req, {}, mirror.get(node), "spread")
            if measuring:
                latencies.append(time.perf_counter() - t0)
                place_trips += out.round_trips
                conflicts += out.attempts - 1
            if out.ok:
                return node, uid
            if measuring:
                refused += 1
        return None

    async def cycler(i: int) -> None:
        nonlocal count
        r = random.Random(seed * 1000 + i)
        while loop.time() < t_end:
            got = await place_somewhere(r)
            if got is None:
                continue
            node, uid = got
            await ledger.mark_bound(node, uid)
            await ledger.release(node, uid)
            if measuring:
                count += 1

    async def placer(i: int, r: random.Random) -> None:
        nonlocal count
        while len(placed) < quota and loop.time() < t_end:
            got = await place_somewhere(r)
            if got is not None:
                placed.append(got)
                count += 1

    base: dict[str, float] = {}

    def mark() -> dict[str, float]:
        return {"cpu": time.process_time(), "trips": ledger.round_trips, "refetches": mirror.refetches,
                "applied": mirror.applied, "t": loop.time()}

    async def clock() -> None:
        nonlocal measuring
        await asyncio.sleep(max(0.0, t_measure - loop.time()))
        base.update(mark())
        measuring = True

    totals = {"t": 0.0, "cpu": 0.0, "trips": 0.0, "refetches": 0.0, "applied": 0.0}
    round_elapsed: list[float] = []  # place: each round's timed fill (the parent takes the slowest client's)
    if mode == "cycle":
        clock_task = asyncio.create_task(clock())
        await asyncio.gather(*(cycler(i) for i in range(coroutines)))
        await clock_task
        end = mark()
        totals = {k: end[k] - base[k] for k in totals}
    else:
        # rounds: every process fills its share of the cluster (timed), then all give it back (untimed)
        rs = [random.Random(seed * 1000 + i) for i in range(coroutines)]
        t_end = t_start + 600
        for _ in range(rounds):
            await asyncio.to_thread(barrier.wait)
            base.update(mark())
            measuring = True
            await asyncio.gather(*(placer(i, rs[i]) for i in range(coroutines)))
            measuring = False
            end = mark()
            round_elapsed.append(end["t"] - base["t"])
            for k in totals:
                totals[k] += end[k] - base[k]
            await asyncio.to_thread(barrier.wait)

            async def give_back(chunk: list[tuple[str, str]]) -> None:
                for node, uid in chunk:
                    await ledger.release(node, uid)

            await asyncio.gather(*(give_back(placed[i::coroutines]) for i in range(coroutines)))
            placed.clear()
    elapsed = totals["t"]
    cpu = totals["cpu"]
    trips = int(totals["trips"])
    refetches = int(totals["refetches"])
    applied = int(totals["applied"])
    await mirror.stop()
    await conn.aclose()
    await sub.aclose()
    latencies.sort()
    return {"worker": worker, "count": count, "elapsed": elapsed, "round_elapsed": round_elapsed or [elapsed],
            "refused": refused, "conflicts": conflicts,
            "round_trips": trips, "place_round_trips": place_trips, "mirror_refetches": refetches,
            "mirror_applied": applied, "cpu_seconds": cpu,
            "place_p50_ms": 1000 * latencies[len(latencies) // 2] if latencies else 0.0,
            "place_p99_ms": 1000 * latencies[int(len(latencies) * 0.99)] if latencies else 0.0}


def client_main(mode: str, url: str, worker: int, coroutines: int, seconds: float, warmup: float, quota: int,
                rounds: int, start: Any, barrier: Any, results: Any, seed: int, profile: bool) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is a dependency
        pass
    coro = client(mode, url, worker, coroutines, seconds, warmup, quota, rounds, start, barrier, seed)
    if profile and worker == 0:
        from pyinstrument import Profiler

        prof = Profiler(async_mode="enabled")
        prof.start()
        out = asyncio.run(coro)
        prof.stop()
        path = PROFILES / f"profile-ledger-{mode}.txt"
        path.write_text(prof.output_text(unicode=False, color=False, show_all=False))
        out["profile"] = str(path)
    else:
        out = asyncio.run(coro)
    results.put(out)
