"""What a mirror's periodic resync costs its role, side by side in one run, against a real redis-server:

- **resync**: CPU (this process) and wall time of one `Mirror.resync()`: reading and decoding every node
  (what every resync did before), reading every node and decoding only the replies that differ from the text
  last read (every FULL_EVERY-th periodic resync now), and reading only the nodes whose (version, stamp)
  is not the one held (the other periodic resyncs), with `--changed` of the nodes booked between two resyncs
  (their feed messages never reach this mirror: it is not started, so only the resync sees them);
  interleaved rounds, the median of each, with what the resync cost redis-server's main thread (reading a
  node is one `snapshot` script, reading its (version, stamp) one HMGET).
- **garbage collector**: objects the collector tracks once the mirror and the extender's ranking hold every
  node, and how long a full collection of them takes, when only the fills are computed (`fill`, now: from
  the records) and when every node's CardStates are built too (`states`, what computing the fill did before).

  python -m bench.resync_micro --nodes 1000 5000 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import random
import statistics
import time
from collections.abc import Awaitable, Callable

from redis.asyncio import Redis

from controller.ranking import Ranking
from deploy.local.redis import RedisServer, new_password
from shared.domain.node import Card, Inventory
from shared.store.ledger import Ledger
from shared.store.mirror import FULL_EVERY, Mirror


async def fill_ledger(led: Ledger, nodes: int, booked: float, rng: random.Random) -> list[str]:
    names = [f"{'s4000' if i % 2 == 0 else 's5000'}-{i:05d}" for i in range(nodes)]
    sem = asyncio.Semaphore(64)

    async def one(i: int, name: str) -> None:
        cap = (96, 160)[i % 2]
        async with sem:
            await led.upsert_node(Inventory(name, tuple(Card(name, c, cap) for c in range(8))))
            if rng.random() < booked:
                await led.reserve(name, f"u-{name}", [rng.randrange(8)], rng.choice((2, 8, 16)), 2, 1, pod="b/p")

    await asyncio.gather(*(one(i, n) for i, n in enumerate(names)))
    return names


def redis_cpu_ms(pid: int) -> float:
    """CPU time of redis-server's main thread (where scripts and commands run), from /proc (ns precision)."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e6


async def timed(op: Callable[[], Awaitable[None]], redis_pid: int) -> tuple[float, float, float]:
    t, c, r = time.perf_counter(), time.process_time(), redis_cpu_ms(redis_pid)
    await op()
    return (time.perf_counter() - t) * 1000, (time.process_time() - c) * 1000, redis_cpu_ms(redis_pid) - r


def full_gc_ms() -> float:
    t = time.perf_counter()
    gc.collect()
    return (time.perf_counter() - t) * 1000


async def one_size(url: str, redis_pid: int, nodes: int, rounds: int, changed: float) -> None:
    rng = random.Random(nodes)
    client = Redis.from_url(url, decode_responses=True)
    await client.flushall()
    led = Ledger(client)
    await led.load_scripts()
    names = await fill_ledger(led, nodes, 0.3, rng)
    mirror = Mirror(Ledger(Redis.from_url(url, decode_responses=True)))
    await mirror.ledger.load_scripts()
    gc.collect()
    gc.freeze()  # what was here before the mirror (as a role freezes its start): not counted below
    await mirror.resync(full=True)
    Ranking(mirror)  # every node's fill, as the extender's ranking asks for it
    gc.collect()
    fill_objects, fill_gc = len(gc.get_objects()), statistics.median(full_gc_ms() for _ in range(3))
    for snap in mirror.nodes.values():
        snap.states()  # what computing the fill built before: a Card and a CardState per card
    states_objects, states_gc = len(gc.get_objects()), statistics.median(full_gc_ms() for _ in range(3))
    gc.unfreeze()

    modes = ("decode every reply", "decode changed replies", "read changed nodes")
    times: dict[str, list[tuple[float, float, float]]] = {m: [] for m in modes}
    for r in range(rounds):
        for mode in modes if r % 2 == 0 else modes[::-1]:
            await mirror.resync(full=True)  # the same starting point for each: every digest current
            for name in rng.sample(names, int(len(names) * changed)):
                await led.reserve(name, f"r{r}-m{modes.index(mode)}-{name}", [rng.randrange(8)], 2, 1, 1, pod="b/q")
            # the periodic resync reads every node every FULL_EVERY-th time, else only the changed nodes
            mirror.resyncs = FULL_EVERY - 1 if mode == modes[1] else 0
            times[mode].append(await timed(functools.partial(mirror.resync, full=mode == modes[0]), redis_pid))
    med = {m: tuple(statistics.median(x[i] for x in v) for i in range(3)) for m, v in times.items()}
    cells = " | ".join(f"{w:.0f} / {c:.0f} / {rc:.0f}" for w, c, rc in med.values())
    base = med[modes[0]][1]
    print(f"{nodes} | {changed:.0%} | {cells} | {base / med[modes[1]][1]:.1f}x, {base / med[modes[2]][1]:.1f}x | "
          f"{states_objects} / {states_gc:.0f} | {fill_objects} / {fill_gc:.0f} | {states_gc / fill_gc:.1f}x")
    await client.aclose()
    await mirror.ledger.redis.aclose()


async def run(args: argparse.Namespace) -> None:
    server = RedisServer(password=new_password()).start()
    try:
        print("nodes | changed | wall / CPU / Redis CPU ms: every node read, every reply decoded | every node read, "
              "changed replies decoded | changed nodes read (version, stamp) | CPU ratios | tracked objects / full "
              "gc ms, states | the same, fill only | gc ratio")
        for n in args.nodes:
            assert server.proc is not None
            await one_size(server.url, server.proc.pid, n, args.rounds, args.changed)
    finally:
        server.cleanup()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--changed", type=float, default=0.02, help="share of nodes booked between two resyncs")
    asyncio.run(run(ap.parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
