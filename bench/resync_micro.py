"""What a mirror's periodic resync costs its role, side by side in one run, against a real redis-server:

- **resync**: CPU (this process) and wall time of one `Mirror.resync()` of every node, decoding every reply
  (`full`, what every resync did before) against decoding only the replies that differ from the text last
  read (`incremental`, what the periodic resync does now), with `--changed` of the nodes booked between two
  resyncs (their feed messages never reach this mirror: it is not started, so only the resync sees them);
  interleaved rounds, the median of each.
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
from shared.store.mirror import Mirror


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


async def timed(op: Callable[[], Awaitable[None]]) -> tuple[float, float]:
    t, c = time.perf_counter(), time.process_time()
    await op()
    return (time.perf_counter() - t) * 1000, (time.process_time() - c) * 1000


def full_gc_ms() -> float:
    t = time.perf_counter()
    gc.collect()
    return (time.perf_counter() - t) * 1000


async def one_size(url: str, nodes: int, rounds: int, changed: float) -> None:
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

    times: dict[str, list[tuple[float, float]]] = {"full": [], "incremental": []}
    for r in range(rounds):
        for mode in ("full", "incremental") if r % 2 == 0 else ("incremental", "full"):
            await mirror.resync(full=True)  # the same starting point for both: every digest current
            for name in rng.sample(names, int(len(names) * changed)):
                await led.reserve(name, f"r{r}-{mode}-{name}", [rng.randrange(8)], 2, 1, 1, pod="b/q")
            times[mode].append(await timed(functools.partial(mirror.resync, full=mode == "full")))
    med = {m: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for m, v in times.items()}
    (fw, fc), (iw, ic) = med["full"], med["incremental"]
    print(f"{nodes} | {changed:.0%} | {fw:.0f} / {fc:.0f} | {iw:.0f} / {ic:.0f} | {fc / ic:.1f}x | "
          f"{states_objects} / {states_gc:.0f} | {fill_objects} / {fill_gc:.0f} | {states_gc / fill_gc:.1f}x")
    await client.aclose()
    await mirror.ledger.redis.aclose()


async def run(args: argparse.Namespace) -> None:
    server = RedisServer(password=new_password()).start()
    try:
        print("nodes | changed | full resync wall / CPU ms | incremental wall / CPU ms | CPU ratio | "
              "tracked objects / full gc ms, states | the same, fill only | gc ratio")
        for n in args.nodes:
            await one_size(server.url, n, args.rounds, args.changed)
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
