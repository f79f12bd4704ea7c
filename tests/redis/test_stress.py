"""Concurrency stress on a real Redis: several processes, each many coroutines with its own mirror.

What must hold, sampled during the run and checked after it: every card has 0 <= used <= capacity
and free == capacity - used (memory and cores), 0 <= slices <= limit, the live reservations on a
card add up to exactly its usage, and the ledger holds exactly what the workers hold (no booking
lost, none leaked); after all releases nothing is booked and no reservation key is left.

Bounded: a fixed number of operations per coroutine and a time limit per run. No timing assertion.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import queue as queue_mod
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from redis import exceptions as rexc
from redis.asyncio import Redis

from deploy.local.redis import RedisServer
from shared.config import Config
from shared.domain.annotations import PodUsage
from shared.domain.models import CardModel
from shared.domain.request import pod_request
from shared.store.ledger import Ledger
from shared.store.placing import place
from tests.redis import stress_worker
from tests.redis.helpers import (
    S4000,
    S5000,
    actual_usage,
    all_violations,
    expected_usage,
    inventory,
    slice_pod,
)

# A small cluster, so that cards run full and replicas collide: 3 nodes x 2 cards.
INVENTORIES = [inventory("s4000-a", S4000), inventory("s5000-b", S5000), inventory("s4000-c", S4000, slice_limit=4)]
CAPACITY = {"s4000-a": S4000, "s5000-b": S5000, "s4000-c": S4000}
CFG = Config(memory_per_card=(CardModel(S4000), CardModel(S5000)))


@dataclass
class Checker:
    """Samples every node's snapshot while the workers run and records any broken invariant."""

    ledger: Ledger
    samples: int = 0
    redis_errors: int = 0
    violations: list[str] = field(default_factory=list)
    reservations_seen: int = 0

    stopped: bool = False

    async def run(self) -> None:
        names = [i.node for i in INVENTORIES]
        # Ended by `stop`, not by cancel alone: once, after a Redis restart, a cancel was lost inside the
        # pipelined snapshots call (py-spy showed this loop still polling minutes after the cancel, and a
        # CI run hung here); where redis-py drops it is not found yet.
        while not self.stopped:
            try:
                snaps = await self.ledger.snapshots(names)
            except (rexc.ConnectionError, rexc.TimeoutError, OSError):
                self.redis_errors += 1
                await asyncio.sleep(0.05)
                continue
            self.samples += 1
            self.reservations_seen = max(self.reservations_seen, sum(len(s.reservations) for s in snaps.values()))
            self.violations += all_violations(snaps)[:5]
            await asyncio.sleep(0.01)

    async def stop(self, task: asyncio.Task[None]) -> None:
        self.stopped = True
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 30.0)  # bounded: ends at its next loop at the latest


@dataclass
class Fleet:
    """The worker processes and their control events."""

    procs: list[Any]
    queue: Any
    pause: Any
    stop: Any
    quiet: Any
    release_all: Any

    async def wind_down(self, led: Ledger) -> tuple[dict[str, PodUsage], list[dict[str, Any]]]:
        """Once the workers end: the ledger must hold exactly what they hold, every worker's mirror
        must equal the ledger; then they release everything. Returns their holdings and stats."""
        truth = merge(await self.collect("held"))
        await assert_ledger_matches(led, truth)
        self.quiet.set()
        synced = await self.collect("synced")
        assert all(ok for (ok,) in synced.values()), f"a worker's mirror never converged: {synced}"
        self.release_all.set()
        done = await self.collect("done")
        return truth, [d[0] for d in done.values()]

    async def collect(self, kind: str, within: float = 60.0) -> dict[int, tuple[Any, ...]]:
        """One message of `kind` from every worker (a crash report fails the test at once)."""
        got: dict[int, tuple[Any, ...]] = {}
        deadline = time.monotonic() + within
        while len(got) < len(self.procs):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"workers {sorted(set(range(len(self.procs))) - set(got))} sent no {kind!r}")
            try:
                msg = await asyncio.to_thread(self.queue.get, True, min(left, 1.0))
            except queue_mod.Empty:
                dead = [p.exitcode for p in self.procs if p.exitcode not in (None, 0)]
                assert not dead, f"a worker died with exit code {dead}"
                continue
            if msg[0] == "crash":
                raise AssertionError(f"worker {msg[1]} crashed:\n{msg[2]}")
            assert msg[0] == kind, f"expected {kind!r} from the workers, got {msg[0]!r}"
            got[msg[1]] = msg[2:]
        return got


@contextlib.asynccontextmanager
async def fleet(url: str, workers: int, coroutines: int, ops: int, seconds: float, seed: int,
                lifetime: tuple[float, float] = (0.0, 0.03),
                lifetimes: list[tuple[float, float]] | None = None,
                max_placed: list[int] | None = None) -> AsyncIterator[Fleet]:
    """`lifetimes`: one range per worker instead of the same `lifetime` for all; `max_placed`: per worker,
    the most pods it places (small slices; 0: any number, any shape)."""
    ctx = mp.get_context("spawn")
    q, pause, stop, quiet, release_all = ctx.Queue(), ctx.Event(), ctx.Event(), ctx.Event(), ctx.Event()
    procs = []
    for w in range(workers):
        plan = stress_worker.Plan(url=url, worker=w, coroutines=coroutines, ops=ops, seconds=seconds,
                                  seed=seed * 100 + w, nodes=CAPACITY,
                                  lifetime=lifetimes[w] if lifetimes else lifetime,
                                  max_placed=max_placed[w] if max_placed else 0)
        proc = ctx.Process(target=stress_worker.main, args=(plan, q, pause, stop, quiet, release_all),
                           daemon=True)
        proc.start()
        procs.append(proc)
    try:
        yield Fleet(procs, q, pause, stop, quiet, release_all)
    finally:
        stop.set()
        quiet.set()
        release_all.set()
        for proc in procs:
            await asyncio.to_thread(proc.join, 15)
            if proc.is_alive():
                proc.kill()
                proc.join()


async def assert_ledger_matches(led: Ledger, truth: dict[str, PodUsage], all_bound: bool = False) -> None:
    """The ledger holds exactly the placements in `truth`: same uids, same cards, same usage."""
    snaps = await led.snapshots(await led.nodes())
    assert sorted(snaps) == sorted(CAPACITY)
    assert all_violations(snaps) == []
    held = {uid: (name, r) for name, s in snaps.items() for uid, r in s.reservations.items()}
    assert sorted(held) == sorted(truth), "the ledger's reservations differ from the placements the API holds"
    for uid, usage in truth.items():
        node, r = held[uid]
        assert (node, r.cards, r.mem, r.cores, r.slices) == (usage.node, usage.cards, usage.memory, usage.cores,
                                                              usage.slices), uid
        if all_bound:
            assert r.state == "bound", uid
    assert actual_usage(snaps) == expected_usage(truth.values())


async def assert_nothing_booked(led: Ledger) -> None:
    snaps = await led.snapshots(await led.nodes())
    assert all_violations(snaps) == []
    assert actual_usage(snaps) == {}
    assert all(not s.reservations for s in snaps.values())
    for s in snaps.values():
        for c in s.cards.values():
            assert (c.mem_free, c.cores_free, c.health) == (c.capacity, c.cores, "ok")
    leftovers = [k async for k in led.redis.scan_iter(match="mt:*") if ":res:" in k or k.endswith(":pods")]
    assert leftovers == []


async def _until_booked(led: Ledger, within: float, besides: frozenset[str] | set[str] = frozenset(),
                        at_least: int = 1, prefix: str = "") -> bool:
    """Poll (bounded) until the ledger holds `at_least` reservations whose uids start with `prefix` and are
    not in `besides`."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):  # Redis may be restarting under the workers (a call is bounded too)
            snaps = await asyncio.wait_for(led.snapshots(await asyncio.wait_for(led.nodes(), 5.0)), 5.0)
            if sum(uid not in besides and uid.startswith(prefix)
                   for s in snaps.values() for uid in s.reservations) >= at_least:
                return True
        await asyncio.sleep(0.05)
    return False


def merge(truths: dict[int, tuple[Any, ...]]) -> dict[str, PodUsage]:
    out: dict[str, PodUsage] = {}
    for t in truths.values():
        out.update(t[0])
    return out


@pytest.mark.redis
async def test_concurrent_placements_never_overcommit_or_leak(redis_server: RedisServer, ledger: Ledger) -> None:
    """3 processes x 16 coroutines, up to 300 operations each, against 6 cards."""
    for inv in INVENTORIES:
        await ledger.upsert_node(inv)
    checker = Checker(Ledger(ledger.redis))
    check_task = asyncio.create_task(checker.run())
    try:
        async with fleet(redis_server.url, workers=3, coroutines=16, ops=300, seconds=20, seed=1) as f:
            truth, stats = await f.wind_down(ledger)
    finally:
        await checker.stop(check_task)
    total = {k: sum(s[k] for s in stats) for k in ("ops", "placed", "refused", "released", "release_missed",
                                                   "bind_missed", "existing", "conflicts", "connection_errors")}
    print(f"\nstress: {total}, checker samples {checker.samples}, max live reservations "
          f"{checker.reservations_seen}, held at the end {len(truth)}")
    assert checker.violations == []
    assert checker.samples > 0
    await assert_nothing_booked(ledger)
    # nothing was lost: every release found its booking and every bind its reservation
    assert total["release_missed"] == 0 and total["bind_missed"] == 0 and total["existing"] == 0
    assert total["released"] == total["placed"]
    assert total["connection_errors"] == 0
    # the run did what it is for: many placements, many refusals on full cards, some collisions
    assert total["placed"] > 200 and total["refused"] > 20


@pytest.mark.redis
async def test_pending_reservations_expire_after_the_ttl(cluster: Ledger) -> None:
    """Random pods placed concurrently; some bound, some released, the rest left pending. After
    the TTL, expire() releases exactly the pending ones; later reservations are not touched."""
    led = cluster
    for inv in INVENTORIES:
        await led.upsert_node(inv)
    rng = random.Random(7)
    nodes = [i.node for i in INVENTORIES] + ["n4", "n5"]
    capacity = {**CAPACITY, "n4": S4000, "n5": S5000}
    placed: dict[str, PodUsage] = {}
    bound: set[str] = set()

    async def one(i: int) -> None:
        await asyncio.sleep(rng.uniform(0, 0.05))
        _shape, pod = stress_worker.random_pod(rng)
        req = pod_request(pod, CFG)
        assert req is not None
        uid = f"t-{i}"
        for node in rng.sample(nodes, len(nodes)):
            out, _ = await place(led, node, uid, req, {}, None, rng.choice(["spread", "binpack"]))
            if out.ok:
                placed[uid] = PodUsage(node, out.cards, *req.booking_for(capacity[node]))
                r = rng.random()
                if r < 0.4:
                    assert await led.mark_bound(node, uid)
                    bound.add(uid)
                elif r < 0.6:
                    assert await led.release(node, uid)
                    del placed[uid]
                return

    await asyncio.gather(*(one(i) for i in range(60)))
    pending = set(placed) - bound
    assert pending and bound, "the random run should leave both pending and bound reservations"
    await asyncio.sleep(1.2)
    late = {}
    req = pod_request(slice_pod((2, 1)), CFG)
    assert req is not None
    for k in range(3):
        for node in nodes:
            out, _ = await place(led, node, f"late-{k}", req, {}, None, "spread")
            if out.ok:
                late[f"late-{k}"] = PodUsage(node, out.cards, 2, 1, 1)
                break
    expired: set[str] = set()
    for node in nodes:
        got = await led.expire(node, 1.0)
        assert len(got) == len(set(got))
        expired |= set(got)
    assert expired == pending
    for node in nodes:
        assert await led.expire(node, 1.0) == []
    snaps = await led.snapshots(await led.nodes())
    assert all_violations(snaps) == []
    live = {uid: placed[uid] for uid in bound} | late
    assert sorted(uid for s in snaps.values() for uid in s.reservations) == sorted(live)
    assert actual_usage(snaps) == expected_usage(live.values())


@pytest.mark.redis
async def test_redis_restart_mid_run_then_rebuild_from_api_truth(redis_server: RedisServer, ledger: Ledger) -> None:
    """Redis restarts (and loses everything) while 2 processes x 12 coroutines work. They retry and
    keep going; then, with the workers paused, a rebuild from what the API holds must give exactly
    that state; the workers go on over the rebuilt ledger, and in the end everything is released."""
    for inv in INVENTORIES:
        await ledger.upsert_node(inv)
    control = Redis.from_url(redis_server.url, decode_responses=True)
    checker = Checker(Ledger(control))
    check_task = asyncio.create_task(checker.run())
    try:
        async with fleet(redis_server.url, workers=2, coroutines=12, ops=100_000, seconds=120, seed=3,
                         # worker 0's pods come and go (they meet the outage), worker 1's outlive a slow restart;
                         # worker 1 places 4 small slices only: long-lived pods that fill the cards would leave
                         # worker 0 no room, so it would neither meet the outage nor book after the rebuild
                         lifetimes=[(0.0, 0.3), (60.0, 90.0)], max_placed=[0, 4]) as f:
            # let bookings pile up (waits on the condition, bounded: a loaded machine starts the workers late)
            # worker 1's pods (uids w1-...) are the ones that outlive the restart: wait for some of them
            assert await _until_booked(ledger, 60.0, at_least=4, prefix="w1-"), "worker 1 made no 4 bookings in 60 s"
            # and worker 0 is at work (a loaded machine starts one process seconds after the other): the outage
            # must meet its calls
            assert await _until_booked(ledger, 60.0, prefix="w0-"), "worker 0 made no booking in 60 s"
            # down for a second, then back empty: every key and script is gone
            await asyncio.to_thread(redis_server.stop)
            await asyncio.sleep(1.0)
            await asyncio.to_thread(redis_server.start)
            await asyncio.sleep(0.5)  # the workers meet errors, then unregistered nodes, and go on
            f.pause.set()
            paused = await f.collect("paused")
            truth = merge(paused)
            assert truth, "the workers should hold placements from before the restart"
            # the rebuild a watcher does on finding the state lost: nodes and bound pods from the API
            assert not await ledger.intact()
            bound = {uid: (u, f"default/{uid}") for uid, u in truth.items()}
            stats = await ledger.rebuild(INVENTORIES, bound)
            assert stats["bound"] == len(truth) and stats["removed"] == 0
            print(f"\nrestart: rebuilt from {len(truth)} placements the API holds")
            await assert_ledger_matches(ledger, truth, all_bound=True)
            f.pause.clear()
            # and on they go, over the rebuilt ledger: until it holds a booking made after the rebuild
            assert await _until_booked(ledger, 60.0, besides=set(truth)), "no booking after the rebuild"
            f.stop.set()
            _, stats_ = await f.wind_down(ledger)
    finally:
        await checker.stop(check_task)
        await control.aclose()
    total = {k: sum(s[k] for s in stats_) for k in ("ops", "placed", "released", "release_missed", "bind_missed",
                                                    "connection_errors")}
    print(f"\nrestart: {total}, checker samples {checker.samples} (Redis errors {checker.redis_errors})")
    assert checker.violations == []
    await assert_nothing_booked(ledger)
    assert total["placed"] > 0 and total["connection_errors"] > 0
