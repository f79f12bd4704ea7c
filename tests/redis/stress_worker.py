"""One worker process of the ledger stress tests (started with multiprocessing "spawn").

A worker runs many coroutines over one Ledger and its own Mirror, like an extender replica: each
coroutine places random pods (slices of random valid sizes, several containers, exclusive cards,
multi-card pods; built by shared.domain.request from pod dicts) with Ledger.place, "binds" them (records
the placement as the pod's annotations would, then mark_bound) and releases at random, with random
delays. Every Redis call is retried on connection errors, as a replica would, so a Redis restart
only slows it down.

`truth` is what the API server would hold: a placement is recorded the moment place() succeeds
(the binder writes the annotations with the Binding) and dropped before release() is sent (the pod
is deleted first). The parent rebuilds from it and compares the ledger with it.

Protocol over `queue` (parent <- worker): ("paused", id, truth) whenever `pause` is set and every
coroutine is idle; ("held", id, truth) once all coroutines ended (ops or time used up, or `stop`);
after `quiet` is set (every worker ended), ("synced", id, ok) telling whether its mirror equals the
ledger; after `release_all` is set, ("done", id, stats) when everything it held is released;
("crash", id, traceback) on any unexpected error.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from redis import exceptions as rexc
from redis.asyncio import Redis

from shared.config import Config
from shared.domain.annotations import PodUsage
from shared.domain.models import CardModel
from shared.domain.request import SliceRequest, pod_request
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from shared.store.placing import place
from tests.redis.helpers import exclusive_pod, multi_pod, slice_pod

T = TypeVar("T")
CFG = Config(memory_per_card=(CardModel(96), CardModel(160)))


@dataclass
class Plan:
    url: str
    worker: int
    coroutines: int
    ops: int  # per coroutine (bounded in count) ...
    seconds: float  # ... and in time
    seed: int
    nodes: dict[str, int]  # node -> capacity of its cards
    max_held: int = 4  # pods a coroutine holds at most
    lifetime: tuple[float, float] = (0.0, 0.03)  # seconds a pod lives once placed (uniform)
    bind_ratio: float = 0.85  # the rest stays pending until released (or expired)
    max_delay: float = 0.004
    # at most this many pods placed in all (0: no limit), each a small slice (<= 8 units, <= 4 cores): a
    # worker of long-lived pods that can never fill the cluster, so the others always find room
    max_placed: int = 0


@dataclass
class Stats:
    ops: int = 0
    placed: int = 0
    refused: int = 0
    released: int = 0
    release_missed: int = 0  # release() found nothing to release
    bound: int = 0
    bind_missed: int = 0  # mark_bound() found no reservation
    existing: int = 0  # place() answered with an earlier booking (must stay 0: uids are unique)
    conflicts: int = 0  # extra reserve attempts after a stale snapshot
    place_trips: int = 0
    connection_errors: int = 0
    mirror_synced: bool = False
    mirror_applied: int = 0
    mirror_refetches: int = 0
    round_trips: int = 0
    shapes: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def random_pod(rng: random.Random) -> tuple[str, dict[str, Any]]:
    r = rng.random()
    if r < 0.55:
        pin = rng.choice([None, None, None, "S4000", "S5000"])
        sizes = [2, 4, 8, 16, 32, 64] + ([96] if pin == "S4000" else [])
        sizes += [128, 160] if pin == "S5000" else []
        return "slice", slice_pod((rng.choice(sizes), rng.randint(1, 16)), pin=pin)
    if r < 0.8:
        return "slices-2", slice_pod((rng.choice([2, 4, 8, 16]), rng.randint(1, 8)),
                                     (rng.choice([2, 4, 8, 32]), rng.randint(1, 8)))
    if r < 0.92:
        return "exclusive", exclusive_pod(pin=rng.choice([None, "S4000", "S5000"]))
    return "multi-2", multi_pod(2, pin=rng.choice([None, "S4000", "S5000"]))


class Worker:
    def __init__(self, plan: Plan, queue: Any, pause: Any, stop: Any, quiet: Any, release_all: Any):
        self.plan = plan
        self.queue = queue
        self.pause = pause
        self.stop = stop
        self.quiet = quiet
        self.release_all = release_all
        self.stats = Stats()
        self.truth: dict[str, PodUsage] = {}
        self.busy = 0
        self.placing = 0  # placements made or in flight
        self.deadline = time.monotonic() + plan.seconds  # set again once the mirror is ready

    async def retrying(self, op: Callable[[], Awaitable[T]]) -> T:
        """Run one ledger call until Redis answers (a replica's retry loop)."""
        delay = 0.02
        while True:
            try:
                return await op()
            except (rexc.ConnectionError, rexc.TimeoutError, OSError):
                self.stats.connection_errors += 1
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)

    async def run(self) -> None:
        p = self.plan
        self.client = Redis.from_url(p.url, decode_responses=True)
        self.sub = Redis.from_url(p.url, decode_responses=True)
        self.ledger = Ledger(self.client)
        self.ledger.retry_seconds = 0  # meet a Redis restart as errors (what the restart test is about)
        self.mirror = Mirror(self.ledger, subscriber=self.sub, resync_seconds=5)
        await self.mirror.start()
        await asyncio.wait_for(self.mirror.ready.wait(), 20)
        # the time budget counts from the first operation, and time spent paused is added back (pauser):
        # a loaded machine that starts the workers late must not leave them timed out when the parent resumes
        self.deadline = time.monotonic() + p.seconds
        tasks = [asyncio.create_task(self.coroutine(i, random.Random(p.seed * 1000 + i)))
                 for i in range(p.coroutines)]
        pauser = asyncio.create_task(self.pauser())
        await asyncio.gather(*tasks)
        pauser.cancel()
        self.queue.put(("held", p.worker, dict(self.truth)))
        await self.wait_for(self.quiet)
        # nobody writes now: the mirror must converge to the ledger (its copy is what replicas fit on)
        names = await self.retrying(self.ledger.nodes)
        deadline = time.monotonic() + 30.0  # bounded; a loaded machine delivers the feed late
        while time.monotonic() < deadline:
            if self.mirror.nodes == await self.retrying(lambda: self.ledger.snapshots(names)):
                self.stats.mirror_synced = True
                break
            await asyncio.sleep(0.02)
        self.stats.mirror_applied = self.mirror.applied
        self.stats.mirror_refetches = self.mirror.refetches
        self.queue.put(("synced", p.worker, self.stats.mirror_synced))
        await self.wait_for(self.release_all)
        for uid, usage in list(self.truth.items()):
            del self.truth[uid]
            if await self.retrying(lambda uid=uid, node=usage.node: self.ledger.release(node, uid)):
                self.stats.released += 1
            else:
                self.stats.release_missed += 1
        self.stats.round_trips = self.ledger.round_trips
        await self.mirror.stop()
        await self.client.aclose()
        await self.sub.aclose()
        self.queue.put(("done", p.worker, self.stats.as_dict()))

    @staticmethod
    async def wait_for(event: Any) -> None:
        while not event.is_set():  # noqa: ASYNC110 - a multiprocessing event, set by the parent
            await asyncio.sleep(0.02)

    async def pauser(self) -> None:
        while True:
            if self.pause.is_set() and self.busy == 0:
                self.queue.put(("paused", self.plan.worker, dict(self.truth)))
                paused_at = time.monotonic()
                while self.pause.is_set():  # noqa: ASYNC110 - a multiprocessing event, set by the parent
                    await asyncio.sleep(0.01)
                self.deadline += time.monotonic() - paused_at
            await asyncio.sleep(0.01)

    async def coroutine(self, co: int, rng: random.Random) -> None:
        p = self.plan
        held: list[tuple[str, float]] = []  # (uid, time the pod is deleted)
        for i in range(p.ops):
            while self.pause.is_set() and not self.stop.is_set():  # noqa: ASYNC110 - a multiprocessing event, set by the parent
                await asyncio.sleep(0.01)
            if self.stop.is_set() or time.monotonic() > self.deadline:
                break
            now = time.monotonic()
            due = [h for h in held if h[1] <= now]
            if not due and len(held) >= p.max_held:
                await asyncio.sleep(min(0.05, min(h[1] for h in held) - now))
                continue
            if not due and p.max_placed and self.placing >= p.max_placed:
                await asyncio.sleep(0.05)  # placed all it may: it only releases (when due)
                continue
            self.busy += 1
            try:
                self.stats.ops += 1
                if due:
                    h = rng.choice(due)
                    held.remove(h)
                    await self.release(h[0])
                else:
                    uid = f"w{p.worker}-c{co}-{i}"
                    self.placing += 1  # counted before the await: coroutines place concurrently
                    if await self.place(uid, rng):
                        held.append((uid, time.monotonic() + rng.uniform(*p.lifetime)))
                    else:  # unschedulable for now: a scheduler backs off before trying the pod again
                        self.placing -= 1
                        await asyncio.sleep(rng.uniform(0, 4 * p.max_delay))
            finally:
                self.busy -= 1
            await asyncio.sleep(rng.uniform(0, p.max_delay))
        # what is still held stays booked: the parent compares it with the ledger, then asks to release

    async def place(self, uid: str, rng: random.Random) -> bool:
        if self.plan.max_placed:
            shape, pod = "small", slice_pod((rng.choice([2, 4, 8]), rng.randint(1, 4)))
        else:
            shape, pod = random_pod(rng)
        req = pod_request(pod, CFG)
        assert isinstance(req, SliceRequest)
        self.stats.shapes[shape] = self.stats.shapes.get(shape, 0) + 1
        policy = rng.choice(["spread", "binpack"])
        nodes = list(self.plan.nodes)
        rng.shuffle(nodes)
        for node in nodes:  # the extender's filter + bind, simplified: first node that takes it
            out, _fit = await self.retrying(lambda node=node: place(
                self.ledger, node, uid, req, {}, self.mirror.get(node), policy, pod=f"default/{uid}"))
            self.stats.place_trips += out.round_trips
            self.stats.conflicts += out.attempts - 1
            if not out.ok:
                continue
            if out.existing:
                self.stats.existing += 1
            mem, cores, slices = req.booking_for(self.plan.nodes[node])
            # the Binding carries the allocation record: from now on the API server knows this pod
            self.truth[uid] = PodUsage(node, out.cards, mem, cores, slices)
            self.stats.placed += 1
            await asyncio.sleep(rng.uniform(0, self.plan.max_delay))  # the Binding call
            if rng.random() < self.plan.bind_ratio:
                if await self.retrying(lambda node=node: self.ledger.mark_bound(node, uid)):
                    self.stats.bound += 1
                else:
                    self.stats.bind_missed += 1
            return True
        self.stats.refused += 1
        return False

    async def release(self, uid: str) -> None:
        usage = self.truth.pop(uid, None)  # the pod is deleted in the API first
        if usage is None:
            return
        if await self.retrying(lambda: self.ledger.release(usage.node, uid)):
            self.stats.released += 1
        else:
            self.stats.release_missed += 1


def main(plan: Plan, queue: Any, pause: Any, stop: Any, quiet: Any, release_all: Any) -> None:
    logging.getLogger("mtsched").setLevel(logging.ERROR)  # retries after a restart are expected here
    try:
        asyncio.run(Worker(plan, queue, pause, stop, quiet, release_all).run())
    except BaseException:
        queue.put(("crash", plan.worker, traceback.format_exc()))
