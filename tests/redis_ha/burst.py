"""A burst of scheduling while Redis fails: asyncio workers, each with its own client (as extender
replicas have), place random pods on a few nodes (Ledger.place), bind them (mark_bound) and release
them after a short life.

As the roles do when Redis does not answer (after the ledger's own retries): a placement moves on to
the next node (kube-scheduler would try the pod again later), a failed mark_bound leaves the booking
pending, and a release is sent again until it is answered (the pod is gone from the API already).
Each worker records when Redis acknowledged every change (loop time), so that after a failover a
test can tell which losses were allowed: with asynchronous replication, only what was acknowledged
before the failover completed may be missing. `held` is what the API server would hold (the binder
writes the allocation with the Binding, the pod is deleted before its release is sent), i.e. the
truth a rebuild or the reconciler repairs from.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from redis import exceptions as rexc

from shared.domain.annotations import PodUsage
from shared.domain.request import SliceRequest, pod_request
from shared.store.ledger import UNVERIFIED, Ledger, LedgerError, connect
from shared.store.placing import place
from tests.redis.stress_worker import CFG, random_pod

T = TypeVar("T")


def quick(led: Ledger) -> Ledger:
    """A ledger that gives up after its quick resends: these workers retry by themselves and time every
    acknowledgement (the product's ledger keeps trying for a few seconds, which would hide the failover)."""
    led.retry_seconds = 0
    return led


def redis_unavailable(e: BaseException) -> bool:
    """A failure that waiting cures: no connection, or a cluster whose slot owner is down (redis-py
    raises those as ClusterDownError/TryAgainError, which Ledger._call reports as LedgerError)."""
    if isinstance(e, rexc.ConnectionError | rexc.TimeoutError | OSError | rexc.ClusterError | rexc.SlotNotCoveredError):
        return True
    return isinstance(e, LedgerError) and isinstance(e.__cause__, rexc.ClusterError | rexc.TryAgainError)


@dataclass
class Holding:
    usage: PodUsage
    acked: float  # when Redis answered the reservation


@dataclass
class Burst:
    url: str
    capacity: dict[str, int]  # node -> units per card
    workers: int = 6
    seed: int = 1
    lifetime: tuple[float, float] = (0.05, 1.0)  # seconds a pod lives once placed
    patience: float = 30.0  # retrying(): a call that Redis does not answer for this long fails the run
    held: dict[str, Holding] = field(default_factory=dict)
    released: dict[str, float] = field(default_factory=dict)  # uid -> when its release was answered
    unanswered: dict[str, float] = field(default_factory=dict)  # uid -> last placement Redis did not answer
    release_missed: list[str] = field(default_factory=list)  # release() found nothing (data lost)
    bind_missed: list[str] = field(default_factory=list)  # mark_bound() found no reservation
    acks: list[float] = field(default_factory=list)  # when each successful change was answered
    placed: list[float] = field(default_factory=list)  # when each new booking was answered
    unavailable: int = 0  # calls sent again because Redis was not there
    unverified: list[float] = field(default_factory=list)  # when a placement was refused on an unverified node
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    def acked_after(self, t: float) -> int:
        return sum(1 for a in self.acks if a > t)

    async def run(self) -> None:
        clients = [connect(self.url) for _ in range(self.workers)]
        try:
            await asyncio.gather(*(self.worker(w, quick(Ledger(c))) for w, c in enumerate(clients)))
        finally:
            for c in clients:
                await c.aclose()

    async def retrying(self, op: Callable[[], Awaitable[T]]) -> T:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.patience
        delay = 0.02
        while True:
            try:
                return await op()
            except Exception as e:
                if not redis_unavailable(e) or loop.time() > deadline:
                    raise
                self.unavailable += 1
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.3)

    async def worker(self, w: int, led: Ledger) -> None:
        loop = asyncio.get_running_loop()
        rng = random.Random(self.seed * 1000 + w)
        mine: list[tuple[str, float]] = []  # (uid, when the pod is deleted)
        unreleased: list[tuple[str, str]] = []  # (uid, node): deleted pods whose release was not answered
        retry_at = 0.0  # unanswered releases are sent again from time to time, as the watchers do
        avoid: dict[str, float] = {}  # node -> until when it is not tried (it did not answer)
        i = 0
        while not self.stop.is_set():
            now = loop.time()
            due = [h for h in mine if h[1] <= now]
            if unreleased and now >= retry_at:
                if await self.release(led, *unreleased[0]):
                    unreleased.pop(0)
                else:
                    retry_at = loop.time() + 0.5
            elif due:
                h = rng.choice(due)
                mine.remove(h)
                node = self.held.pop(h[0]).usage.node  # the pod is deleted in the API first
                if not await self.release(led, h[0], node):
                    unreleased.append((h[0], node))
            elif len(mine) < 4:
                i += 1
                uid = f"w{w}-{i}"
                if await self.place(led, uid, rng, avoid):
                    mine.append((uid, loop.time() + rng.uniform(*self.lifetime)))
                else:
                    await asyncio.sleep(rng.uniform(0, 0.02))  # nothing fits now: back off, as a scheduler does
            await asyncio.sleep(rng.uniform(0, 0.004))
        for uid, node in unreleased:
            await self.retrying(lambda uid=uid, node=node: self.release(led, uid, node, once=False))
        # what is still held stays booked: the test compares it with the ledger, then releases it

    async def place(self, led: Ledger, uid: str, rng: random.Random, avoid: dict[str, float]) -> bool:
        _shape, pod = random_pod(rng)
        req = pod_request(pod, CFG)
        assert isinstance(req, SliceRequest)
        policy = rng.choice(["spread", "binpack"])
        loop = asyncio.get_running_loop()
        for node in rng.sample(sorted(self.capacity), len(self.capacity)):
            if avoid.get(node, 0.0) > loop.time():
                continue
            try:
                out, _fit = await place(led, node, uid, req, {}, None, policy, pod=f"default/{uid}")
            except Exception as e:
                if not redis_unavailable(e):
                    raise
                self.unavailable += 1
                self.unanswered[uid] = loop.time()  # it may have been booked there all the same
                avoid[node] = loop.time() + 1.0  # as a scheduler backs off a failing node
                continue
            if not out.ok:
                if out.refused.startswith(UNVERIFIED):  # Redis's process changed: fenced until compared
                    self.unverified.append(loop.time())
                continue
            self.placed.append(loop.time())
            self.held[uid] = Holding(PodUsage(node, out.cards, *req.booking_for(self.capacity[node])), loop.time())
            self.acks.append(loop.time())
            try:
                if await led.mark_bound(node, uid):
                    self.acks.append(loop.time())
                else:
                    self.bind_missed.append(uid)
            except Exception as e:
                if not redis_unavailable(e):
                    raise
                self.unavailable += 1  # stays pending: the watchers' observe records it as bound
            return True
        return False

    async def release(self, led: Ledger, uid: str, node: str, once: bool = True) -> bool:
        """Send the release; False if Redis did not answer (raises instead with once=False)."""
        try:
            found = await led.release(node, uid)
        except Exception as e:
            if once and redis_unavailable(e):
                self.unavailable += 1
                return False
            raise
        now = asyncio.get_running_loop().time()
        if found:
            self.acks.append(now)
        else:
            self.release_missed.append(uid)
        self.released[uid] = now
        return True

    def truth(self) -> dict[str, PodUsage]:
        return {uid: h.usage for uid, h in self.held.items()}
