"""Red team (resends under stress): a bounded, seeded, randomized run of the ledger's product paths while replies are
lost, so that scripts are run twice (or more) by the ledger's resend rule (LedgerCore._retry).

Several Ledger instances (the replicas) reach a real redis-server through a loopback TCP proxy written here
(LossyProxy) that, with a seeded probability, forwards a command and then cuts the connection instead of forwarding
its reply (the script ran, the client sends it again), or holds the reply past the client's socket timeout and then
cuts (the same, by a TimeoutError). Over it, many pods go through what the product does with them:

* binds (controller/extender.py `bind`): place with a hold (shared/store/placing.py), then the Binding, which the
  "API server" here commits or refuses; committed: the record is in the truth and the booking is marked bound
  (controller/confirm.py, and `observe` when mark_bound finds it gone, as `_rebook` does); refused: the attempt's
  booking is given back with its bind number and name (`give_back(if_bind_no=..., if_attempt=...)`), unless the
  pod is bound on this node with this attempt's record (`_already_bound`), after waiting out the deadline of an
  earlier attempt whose booking it found (`existing`). Some pods have a second attempt (kube-scheduler's retry, on
  another replica) while the first one's Binding or give-back is still under way, on the same node or another;
* the pod watcher: `observe` of bound pods as the API reports them, and `release` once a pod is deleted (deleted
  from the truth first, as the API server does);
* the reconciler: now and then a whole `rebuild`, or one node's `replace_node`, from the truth as read at some
  instant, with its keep window counted from that read (as controller/reconciler.py does).

The truth (the pods the API server holds bound, with their cards) is a model kept here. What must hold, sampled
during the run (read straight from Redis, not through the proxy) and checked after it: no card holds more than its
memory, cores or slices, and its reservations add up to its usage (helpers.all_violations); every pod bound in the
truth throughout a sample is booked on exactly its node, cards and amounts; once quiet, the ledger holds exactly the
truth, no uid booked twice; after every pod is deleted, nothing is booked and no reservation key is left.

The model keeps the product's timing where the ledger relies on it: a pod's next bind attempt comes after the one
before had its reservation answered (kube-scheduler retries a bind once its call to the extender ended or timed out,
long after that attempt reserved; controller/extender.py sends no Binding once its deadline is near), so an attempt
that finds a booking another made (`existing`) started after that one, and its wait for the deadline covers that
attempt's Binding (the extender's "an earlier attempt's, for a booking it made: started before this one").

A second run (`test_late_commands_and_early_retries_keep_the_ledger_true`) also delivers commands late: the proxy
holds a reserve or a release (a give-back, or the watchers' release) past the client's timeout, so the ledger's resend
runs first on a new connection, and then forwards the original, which runs after it (and after whatever other
replicas did meanwhile); and a pod's next attempt may start before the one before had its reservation answered (a
new leader, or kube-scheduler's retry after a call that hung before it reached the ledger), so an attempt that finds
a booking (`existing`) may have started before the attempt that made it, and its wait covers only the attempts that
started before it. More pods have a second attempt there, and Bindings stay longer in flight; and what must hold
is also checked where it happens: no give-back frees a booking while another attempt of the pod booked on that node
has its Binding undecided (neither committed nor refused; and before its deadline, where one is modelled) all through
the read of Redis that judges it, the pod bound nowhere; and the booking is there as a Binding is committed (read from
Redis just before). A reserve delivered after its attempt's give-back books again for nobody (a leak its hold and the
janitor's TTL bound): once quiet and past every hold, such bookings are expired as the janitor would (expire.lua) and
counted; one of a pod none of whose reserves came late, nor failed whole (its command may have run: a name no
give-back takes off), is a violation.

A failure names the broken invariants and tells the story of the pods concerned (each step, with the attempt's bind
number), from which a deterministic test is made (tests/redis/test_redteam_rewrite_bind_no.py was found so).

Bounded: a fixed number of pods per run, a time limit, loopback only. Run with MTSCHED_STRESS_SEEDS="1 2 3" and
MTSCHED_STRESS_PODS=N for more (the defaults, 2 seeds of 120 pods, take seconds)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import random
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import pytest
from redis.asyncio import Redis

from deploy.local.redis import RedisServer
from shared.domain.annotations import PodUsage
from shared.domain.node import Inventory
from shared.domain.request import SliceRequest, pod_request
from shared.domain.state import NodeSnapshot, plan_on
from shared.domain.timing import BIND_MIN_LEFT_S
from shared.store.ledger import Ledger
from shared.store.placing import place
from shared.store.redis_conn import connect
from shared.store.scripts import script_source
from tests.redis.helpers import S4000, S5000, all_violations, inventory
from tests.redis.stress_worker import CFG, random_pod

pytestmark = pytest.mark.redis
T = TypeVar("T")

# 3 nodes x 2 cards: small, so that cards run full and attempts collide
INVENTORIES = [inventory("a", S4000), inventory("b", S5000), inventory("c", S4000, slice_limit=4)]
CAPACITY = {inv.node: c for inv, c in zip(INVENTORIES, (S4000, S5000, S4000), strict=True)}
CLIENT_TIMEOUT = 0.25  # the replicas' socket timeout (the product's is 5 s: the same, faster)
HOLD_S = 0.4  # a held reply is cut after this long: the client timed out first
KEEP_MS = 10_000  # the reconciler's keep window (shared/domain/timing.py)
HOLD_MS = 3000  # reserve's hold_ms (a bind's deadline plus its settle time)
SEEDS = [int(s) for s in os.environ.get("MTSCHED_STRESS_SEEDS", "11 12").split()]
PODS = int(os.environ.get("MTSCHED_STRESS_PODS", "120"))
RUN_LIMIT_S = 120.0


class LossyProxy:
    """A loopback TCP proxy to redis-server that loses replies: each reply (each chunk read from the server) is, with
    probability `cut`, not forwarded and the connection cut; with probability `delay`, held `hold_s` (longer than the
    client's socket timeout) and then cut. Commands always reach the server: what was sent ran. Off until `armed`."""

    def __init__(self, upstream: int, seed: int, cut: float, delay: float, hold_s: float = HOLD_S,
                 late: float = 0.0, late_shas: tuple[str, ...] = ()):
        self.upstream = upstream
        self.rng = random.Random(seed)
        self.cut, self.delay, self.hold_s = cut, delay, hold_s
        # with probability `late`, a command calling one of `late_shas` (EVALSHA) is held `hold_s` (the client times
        # out and sends it again on another connection, which runs first) and then forwarded: it runs late
        self.late, self.late_shas = late, tuple(sha.encode() for sha in late_shas)
        self.armed = False
        self.replies = self.cuts = self.delays = self.lates = 0
        self.holding = 0  # commands held now, to be forwarded ...
        self.idle = asyncio.Event()  # ... none
        self.idle.set()
        self.late_uids: set[str] = set()  # the pods of the commands delivered late
        self._sessions: set[asyncio.Task[Any]] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._session, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._sessions):
            task.cancel()
        await asyncio.gather(*self._sessions, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _session(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        me = asyncio.current_task()
        assert me is not None
        self._sessions.add(me)
        try:
            try:
                server_r, server_w = await asyncio.open_connection("127.0.0.1", self.upstream)
            except OSError:
                return
            replied = asyncio.Event()
            pumps = {asyncio.create_task(self._commands(client_r, server_w, replied)),
                     asyncio.create_task(self._replies(server_r, client_w, replied))}
            try:
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for p in pumps:
                    p.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
                server_w.close()
        finally:
            client_w.close()
            self._sessions.discard(me)

    async def _commands(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        replied: asyncio.Event) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                if (self.armed and self.late and any(sha in data for sha in self.late_shas)
                        and self.rng.random() < self.late):
                    self.lates += 1
                    self.holding += 1
                    self.idle.clear()
                    uid = re.search(rb'"uid":"([^"]+)"', data)
                    if uid:
                        self.late_uids.add(uid.group(1).decode())
                    try:
                        await asyncio.sleep(self.hold_s)  # the client gives up and sends it again first
                        replied.clear()
                        writer.write(data)  # then it runs: after its resend, and whatever came meanwhile
                        await writer.drain()
                        with contextlib.suppress(TimeoutError):  # ran once answered (its reply goes nowhere)
                            await asyncio.wait_for(replied.wait(), 2.0)
                    finally:
                        self.holding -= 1
                        if not self.holding:
                            self.idle.set()
                    return  # (the client is gone)
                writer.write(data)
                await writer.drain()

    async def _replies(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       replied: asyncio.Event) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                self.replies += 1
                replied.set()
                if self.armed:
                    roll = self.rng.random()
                    if roll < self.cut:
                        self.cuts += 1
                        return  # the command ran; its reply goes nowhere
                    if roll < self.cut + self.delay:
                        self.delays += 1
                        await asyncio.sleep(self.hold_s)  # the client gives up on it first
                        return
                writer.write(data)
                await writer.drain()


@dataclass
class Pod:
    uid: str
    req: SliceRequest
    attempts: int
    long_lived: bool
    deciding: list[asyncio.Event] = field(default_factory=list)  # one per attempt, in their order: it is over
    reserved: list[asyncio.Event] = field(default_factory=list)  # one per attempt: its reservation was answered
    # node -> the names (reserve's) of the attempts booked there whose Binding is not decided yet (it may still be
    # committed, by its deadline)
    booked_by: dict[str, set[str]] = field(default_factory=dict)
    until: dict[str, float] = field(default_factory=dict)  # attempt name -> its Binding's deadline (monotonic)
    spec: dict[str, Any] = field(default_factory=dict)  # the pod as created (random_pod)


@dataclass
class Stats:
    pods: int = 0
    unschedulable: int = 0  # fits no node now (kube-scheduler would try again later: not here)
    attempts: int = 0
    booked: int = 0
    existing: int = 0
    refused: int = 0
    committed: int = 0
    conflicts: int = 0  # a Binding refused because another attempt's was committed
    given_back: int = 0
    kept: int = 0
    rebooked: int = 0  # mark_bound found the booking gone: observe (confirm.py _rebook)
    observed: int = 0
    released: int = 0
    rebuilds: int = 0
    replaces: int = 0
    call_failures: int = 0  # a ledger call that failed whole (its resends ran out): called again
    cut: int = 0  # replies the proxy lost by cutting the connection ...
    held: int = 0  # ... and by holding them past the client's timeout
    late: int = 0  # commands the proxy delivered late (after their resend ran)
    early: int = 0  # attempts started before the attempt before had its reservation answered
    leaked: int = 0  # bookings expired once quiet: a late reserve's, booked again for nobody
    not_sent: int = 0  # Bindings not sent: too little of their deadline left once booked
    stood: int = 0  # give-backs heard after another attempt's booking there, which Redis shows made after them
    moot: int = 0  # ... or after which the other attempts there were decided while Redis was read
    samples: int = 0
    violations: list[str] = field(default_factory=list)


class Run:
    """One seeded run: the replicas, the truth, the pods and the reconciler."""

    def __init__(self, seed: int, replicas: list[Ledger], direct: Ledger, pods: int,
                 proxy: LossyProxy | None = None, early: float = 0.0):
        self.rng = random.Random(seed)
        self.proxy = proxy
        self.early = early  # how often a pod's next attempt starts before the one before had its reservation answered
        # with early retries: more pods with a second attempt, and Bindings longer in flight
        self.retried, self.binding_s = (0.6, 0.15) if early else (0.3, 0.03)
        self.failed_places: set[str] = set()  # pods with a place call that failed whole (its reserve may have run)
        self.seed = seed
        self.replicas = replicas
        self.direct = direct  # reads for the checks and the plans: never through the proxy
        self.n_pods = pods
        self.truth: dict[str, PodUsage] = {}  # the API server's bound pods and their records
        self.api = asyncio.Lock()  # the reconciler's read-to-write, with no pod deleted meanwhile (see reconciler)
        self.stats = Stats()
        self.done = False
        self.finish = asyncio.Event()  # long-lived pods are deleted once set
        self.long_lived = 0
        self.waiting = 0  # long-lived pods bound and waiting for `finish`
        self.t0 = time.monotonic()
        self.log: dict[str, list[str]] = {}  # what happened to each pod, for a failure's message
        # pods whose story a failure tells though no violation names them: those booked on a card found over-full
        # (a card's violation names the card, not a uid), or named by the product's over-commit log lines
        self.suspects: set[str] = set()
        self.limits: dict[tuple[str, int], tuple[int, int, int]] = {}  # each card's memory, cores and slice limit
        self.blamed: set[str] = set()  # the card violations whose pods were told (blame)
        # the product's timing, as a subclass scales it (tests/redis/test_redteam_janitor_stress.py)
        self.hold_ms = HOLD_MS  # reserve's hold_ms
        self.keep_ms = KEEP_MS  # the reconciler's keep window
        self.deadline: float | None = None  # a Binding's deadline from its attempt's start (None: not modeled)
        # the booking is read just before a Binding is committed: it must be there
        self.commit_check = bool(early)

    def said(self, uid: str, what: str) -> None:
        self.log.setdefault(uid, []).append(f"{time.monotonic() - self.t0:7.3f} {what}")

    def replica(self) -> Ledger:
        return self.rng.choice(self.replicas)

    async def call(self, what: str, op: Callable[[], Awaitable[T]], uid: str = "") -> T:
        """A ledger call; one that fails whole (its resends ran out) is made again, as its caller would."""
        for _ in range(20):
            try:
                return await op()
            except Exception as e:  # a LedgerError or a connection error after the ledger's own resends
                self.stats.call_failures += 1
                if what == "place":
                    self.failed_places.add(uid)
                last: Exception = e
                await asyncio.sleep(0.01)
        raise AssertionError(f"{what}: failed 20 times, last: {last!r}")

    async def pause(self, most: float) -> None:
        await asyncio.sleep(self.rng.uniform(0, most))

    # -- what a subclass models further (the base: nothing more) -------------------------------------------

    def inventories(self) -> list[Inventory]:
        """The nodes the API server lists now."""
        return INVENTORIES

    async def plan_snapshot(self, led: Ledger, node: str) -> NodeSnapshot | None:
        """What the extender of replica `led` plans from (its mirror's snapshot: maybe stale, maybe none)."""
        return None if self.rng.random() < 0.3 else await self.direct.snapshot(node)

    def heard(self, led: Ledger, feed: Any) -> None:
        """A script's feed message handed back to its caller, replica `led` (the extender applies it to its mirror at
        once)."""

    def crashes(self, pod: Pod, node: str, where: str) -> bool:
        """Whether the binder dies here (`where`: "before_binding", after its booking; "after_commit", before its
        confirmation)."""
        return False

    def committed(self, pod: Pod, mine: PodUsage) -> None:
        """The API server committed the pod's Binding with record `mine` (the pod watcher will see it)."""

    async def watched(self, pod: Pod, usage: PodUsage) -> None:
        """The pod watcher sees the bound pod's record (0 to 2 times)."""
        for _ in range(self.rng.randint(0, 2)):
            await self.pause(0.02)
            await self.observe(pod.uid, usage)

    async def delete(self, pod: Pod, usage: PodUsage) -> None:
        """The pod is deleted in the API (under `api`), then released by the pod watcher."""
        del self.truth[pod.uid]
        if await self.call("release", lambda: self.replica().release(usage.node, pod.uid)):
            self.stats.released += 1

    # -- a pod's life ----------------------------------------------------------------------------------------

    def new_pod(self, i: int) -> Pod:
        _shape, spec = random_pod(self.rng)
        req = pod_request(spec, CFG)
        assert isinstance(req, SliceRequest)
        # a few long-lived pods (small slices, so that the others find room) outlive the run: bound at the end
        long_lived = self.long_lived < 4 and not req.whole_cards and req.memory <= 16 and self.rng.random() < 0.3
        self.long_lived += long_lived
        return Pod(f"s{self.seed}-p{i}", req, 2 if self.rng.random() < self.retried else 1, long_lived, spec=spec)

    async def pod(self, pod: Pod) -> None:
        self.stats.pods += 1
        for _ in range(6):  # kube-scheduler tries an unschedulable pod again later
            fits = await self.fitting(pod)
            if fits:
                break
            await self.pause(0.1)
        else:
            self.stats.unschedulable += 1
            return
        first = self.rng.choice(fits)
        nodes = [first if k == 0 or self.rng.random() < 0.7 else self.rng.choice(fits) for k in range(pod.attempts)]

        async def attempt(k: int, node: str) -> None:
            if k:
                # kube-scheduler's retry (after its call to the extender timed out, or a new leader's): it comes
                # after the attempt before had its reservation answered (its booking made, or refused); its Binding
                # may still be in flight. Or (`early`) before: that attempt's reserve is still on its way
                if self.rng.random() < self.early:
                    self.stats.early += 1
                    await self.pause(0.02)
                else:
                    await pod.reserved[k - 1].wait()
                    await self.pause(0.25)
            await self.bind(pod, node, pod.reserved[k])

        pod.reserved = [asyncio.Event() for _ in nodes]
        await asyncio.gather(*(attempt(k, n) for k, n in enumerate(nodes)))
        usage = self.truth.get(pod.uid)
        if usage is None:
            return  # never bound: every attempt gave its booking back
        await self.watched(pod, usage)
        if pod.long_lived:
            self.waiting += 1
            await self.finish.wait()
        else:
            await self.pause(0.08)
        async with self.api:  # deleted in the API, then released by the pod watcher
            await self.delete(pod, usage)

    async def fitting(self, pod: Pod) -> list[str]:
        """The nodes kube-scheduler would pick from: those where the pod fits now (the extender's filter)."""
        snaps = await self.snapshots()
        listed = {inv.node for inv in self.inventories()}
        return [n for n, s in snaps.items() if n in listed and plan_on(s, pod.uid, pod.req, {}, "spread").ok]

    async def bind(self, pod: Pod, node: str, reserved: asyncio.Event) -> None:
        """One bind attempt, as controller/extender.py `bind` makes it; `reserved` is set once its reservation is
        answered."""
        self.stats.attempts += 1
        # the attempts that started before this one: their Bindings' deadlines end before this one's
        earlier = list(pod.deciding)
        decided = asyncio.Event()
        pod.deciding.append(decided)
        try:
            await self.attempt(pod, node, earlier, reserved)
        finally:
            reserved.set()
            decided.set()

    async def attempt(self, pod: Pod, node: str, earlier: list[asyncio.Event], reserved: asyncio.Event) -> None:
        led = self.replica()
        started = time.monotonic()  # the Binding's deadline counts from here (controller/extender.py)
        snap = await self.plan_snapshot(led, node)  # the mirror, maybe stale
        await self.pause(0.005)
        out, _fit = await self.call("place", lambda: place(led, node, pod.uid, pod.req, {}, snap,
                                                           self.rng.choice(["spread", "binpack"]),
                                                           pod=f"default/{pod.uid}", hold_ms=self.hold_ms),
                             pod.uid)
        reserved.set()
        if out.ok:
            self.heard(led, out.feed)
        if not out.ok:
            self.stats.refused += 1
            self.said(pod.uid, f"{node}: refused ({out.reason})")
            return
        self.said(pod.uid, f"{node}: booked {out.cards} existing={out.existing} bind_no={out.bind_no}")
        self.stats.booked += 1
        self.stats.existing += out.existing
        mem, cores, slices = pod.req.booking_for(CAPACITY[node])
        mine = PodUsage(node, out.cards, mem, cores, slices)  # this attempt's record
        pod.booked_by.setdefault(node, set()).add(out.attempt)
        pod.until[out.attempt] = float("inf") if self.deadline is None else started + self.deadline
        over = False

        def decided() -> None:  # this attempt's Binding is committed, or never will be
            nonlocal over
            if not over:
                over = True
                pod.booked_by[node].discard(out.attempt)

        try:
            if self.deadline is not None and started + self.deadline - time.monotonic() < BIND_MIN_LEFT_S:
                # too late to send the Binding (controller/extender.py): not sent; an attempt that found the booking
                # (`existing`) takes only its own name off
                decided()
                self.stats.not_sent += 1
                fate, feed = await self.call("give_back", lambda: led.give_back(
                    node, pod.uid, None if out.existing else out.bind_no or None, attempt=out.attempt))
                self.heard(led, feed)
                self.said(pod.uid, f"{node}: Binding not sent (deadline), given back: {fate}")
                return
            await self.decide(pod, node, out, mine, earlier, led, decided, started)
        finally:
            decided()

    async def decide(self, pod: Pod, node: str, out: Any, mine: PodUsage, earlier: list[asyncio.Event],
                     led: Ledger, decided: Callable[[], None], started: float) -> None:
        """The Binding of an attempt booked on `node` (`out`, its record `mine`): committed, or refused and the
        booking given back (`decided` is told as its outcome is known)."""
        await self.pause(self.binding_s)  # the Binding call
        if self.crashes(pod, node, "before_binding"):
            self.said(pod.uid, f"{node}: the binder died before its Binding (booking left to the janitor)")
            return
        # with early retries the booking must be there as the Binding is committed: read first, and then (no await
        # between the API's check that the pod is unbound and its commit: one Binding per pod) committed at once
        held = await self.direct.snapshot(node) if self.commit_check else None
        # the API server commits a Binding by its deadline or never (shared/domain/timing.py)
        in_time = self.deadline is None or time.monotonic() < started + self.deadline
        if pod.uid not in self.truth and in_time and self.rng.random() < 0.75:
            if self.commit_check and (held is None or pod.uid not in held.reservations):
                self.stats.violations.append(f"{pod.uid}: Binding committed on {node} {mine.cards} while its "
                                             f"booking was gone")
            elif self.commit_check and held is not None and (
                    (r := held.reservations[pod.uid]).cards, r.mem, r.cores, r.slices) != (
                    mine.cards, mine.memory, mine.cores, mine.slices):
                # the record the Binding carries is booked "as the API server says" once observed, over whatever
                # took the room of the booking's own cards meanwhile
                self.stats.violations.append(f"{pod.uid}: Binding committed on {node} with {mine} while its "
                                             f"booking is {r}")
            self.truth[pod.uid] = mine  # committed, with its record
            self.truth_fits(pod.uid, mine)
            decided()
            self.said(pod.uid, f"{node}: Binding committed {mine.cards}")
            self.stats.committed += 1
            self.committed(pod, mine)
        elif self.truth.get(pod.uid) == mine:
            self.stats.conflicts += 1  # 409, but the pod is bound here with this record: _already_bound
            decided()
        else:
            # refused (by the API server, or past its deadline): this attempt's Binding is decided, never to be
            # committed, though its give-back may wait below for an earlier attempt's Binding
            decided()
            self.stats.conflicts += pod.uid in self.truth
            await self.pause(0.03)  # the extender reads the pod (_already_bound)
            if out.existing and self.truth.get(pod.uid) != mine:
                # an earlier attempt made the booking: its Binding may still be committed, until its deadline
                # (before this one's, which the extender waits out before reading the pod again): over by then
                for e in earlier:
                    await e.wait()
            if self.truth.get(pod.uid) != mine:
                self.said(pod.uid, f"{node}: Binding failed, giving back bind_no={out.bind_no}")
                fate, feed = await self.call("give_back", lambda: led.give_back(node, pod.uid, out.bind_no or None,
                                                                                   attempt=out.attempt))
                self.heard(led, feed)
                self.said(pod.uid, f"{node}: given back bind_no={out.bind_no}: {fate}")
                self.stats.given_back += fate == "released"
                self.stats.kept += fate == "kept"
                if fate == "released" and pod.uid not in self.truth:
                    await self.freed_under_binding(pod, node)
                return
        await self.pause(0.03)  # confirm.py's linger
        if self.crashes(pod, node, "after_commit"):
            self.said(pod.uid, f"{node}: the binder died before its confirmation")
            return
        confirmer = self.replica()  # (the same replica in the product: any one here)
        missing = await self.call("mark_bound", lambda: confirmer.mark_bound_many(node, [pod.uid]))
        self.said(pod.uid, f"{node}: mark_bound missing={missing}")
        if missing and self.truth.get(pod.uid) == mine:  # _rebook: gone while the bind was in flight
            self.stats.rebooked += 1
            await self.observe(pod.uid, mine, confirmer)

    @staticmethod
    def in_flight(pod: Pod, node: str) -> set[str]:
        """The attempts of `pod` booked on `node` whose Binding may still be committed now: undecided (neither
        committed nor refused) and, where the deadline is modelled, before it (the API server commits a Binding by its
        deadline or never; past it, the booking is the janitor's once its hold is over)."""
        now = time.monotonic()
        return {a for a in pod.booked_by.get(node, set()) if now < pod.until.get(a, float("inf"))}

    async def freed_under_binding(self, pod: Pod, node: str) -> None:
        """A give-back answered "released" while another attempt of the pod booked on `node` may still have its
        Binding committed: a violation if that attempt's booking is gone. Replies come in no particular order (each
        over its own connection, some late, some resent), so the other attempt's booking may have been made after
        this release ran, its reply heard first: Redis, read now, tells (nothing else frees a booking whose Binding is
        in flight: the reconciler keeps it, the janitor's hold is not over). Judged only for the attempts in flight
        all through that read: one decided meanwhile (committed, its booking read there just before; or refused and
        its booking given back) or not in flight before it (past its deadline) tells nothing of this give-back."""
        before = self.in_flight(pod, node)
        if not before:
            return
        snap = await self.direct.snapshot(node)
        names = await self.direct.redis.hget(self.direct.keys.res(node, pod.uid), "attempts")
        flying = before & pod.booked_by.get(node, set())  # (an attempt's name leaves booked_by once decided)
        if not flying or pod.uid in self.truth:
            self.stats.moot += 1
            self.said(pod.uid, f"{node}: given back; the other attempts there were decided while Redis was read")
            return
        holders = {e.split(":")[0] for e in str(names or "").split(",") if e}
        if snap is not None and pod.uid in snap.reservations and holders & flying:
            self.said(pod.uid, f"{node}: given back; the booking of another attempt there stands (held by "
                               f"{sorted(holders)})")
            self.stats.stood += 1
            return
        self.stats.violations.append(f"{pod.uid}: its booking on {node} given back while another attempt's Binding "
                                     f"there may still be committed")
        self.said(pod.uid, f"{node}: freed under another attempt's Binding (in flight: {sorted(flying)}; booked: "
                           f"{snap.reservations.get(pod.uid) if snap is not None else None}, held by "
                           f"{sorted(holders)})")

    async def observe(self, uid: str, usage: PodUsage, led: Ledger | None = None) -> None:
        who = led or self.replica()
        out = await self.call("observe", lambda: who.observe(uid, usage, f"default/{uid}", keep_bound=True))
        self.stats.observed += 1
        assert out.get("ok"), f"observe {uid}: {out}"

    # -- the reconciler --------------------------------------------------------------------------------------

    async def reconciler(self) -> None:
        """Now and then, under `api` (no pod is deleted between its read and its write: a deletion then would be
        booked again from the stale truth, which the real reconciler releases after, controller/reconciler.py; the
        checks here would see that as a leak): reads the truth, waits a little, and writes one node or all of them,
        keeping what was made or bound since its read."""
        while not self.done:
            await self.pause(0.25)
            if self.done:
                return
            async with self.api:
                t0 = time.monotonic()
                bound = {uid: (u, f"default/{uid}") for uid, u in self.truth.items()}
                for uid in bound:
                    self.said(uid, "reconciler read the truth")
                await self.pause(0.1)
                keep_ms = self.keep_ms + int((time.monotonic() - t0) * 1000)
                led = self.replica()
                if self.rng.random() < 0.4:
                    self.stats.rebuilds += 1
                    await self.call("rebuild", partial(led.rebuild, self.inventories(), bound, keep_ms=keep_ms,
                                                       keep_bound=True))
                    for uid in bound:
                        self.said(uid, "rebuilt")
                    for n in CAPACITY:
                        self.said(f"node {n}", f"reconciler: rebuilt (keep_ms {keep_ms})")
                else:
                    self.stats.replaces += 1
                    inv: Inventory = self.rng.choice(self.inventories())
                    mine = {u: b for u, b in bound.items() if b[0].node == inv.node}
                    await self.call("replace_node", partial(led.replace_node, inv, mine, keep_ms=keep_ms,
                                                            keep_bound=True))
                    for uid in mine:
                        self.said(uid, f"replaced {inv.node}")
                    self.said(f"node {inv.node}", f"reconciler: replaced (keep_ms {keep_ms}, bound {sorted(mine)})")

    # -- the checks ------------------------------------------------------------------------------------------

    async def snapshots(self) -> dict[str, NodeSnapshot]:
        return await self.direct.snapshots(list(CAPACITY))

    @staticmethod
    def problems(snaps: dict[str, NodeSnapshot], held: dict[str, PodUsage], quiet: bool = False) -> list[str]:
        """Broken invariants of `snaps` given pods `held` bound throughout the read. A uid booked on two nodes is
        one only once `quiet`: two attempts of a pod on two nodes each hold a booking until one gives it back."""
        errs = all_violations(snaps)
        where: dict[str, list[str]] = {}
        for name, s in snaps.items():
            for uid in s.reservations:
                where.setdefault(uid, []).append(name)
        errs += [f"{uid} booked on {nodes}" for uid, nodes in where.items() if quiet and len(nodes) > 1]
        for uid, u in held.items():
            s = snaps.get(u.node)
            r = s.reservations.get(uid) if s is not None else None
            if r is None:
                errs.append(f"{uid} bound on {u.node} cards {u.cards} in the API, not booked there")
            elif (r.cards, r.mem, r.cores, r.slices) != (u.cards, u.memory, u.cores, u.slices):
                errs.append(f"{uid} bound on {u.node} with {u}, booked as {r}")
        return errs

    async def checker(self) -> None:
        while not self.done:
            before = dict(self.truth)
            snaps = await self.snapshots()
            after = self.truth
            held = {uid: u for uid, u in before.items() if after.get(uid) == u}
            self.stats.samples += 1
            found = self.problems(snaps, held)
            if found:
                self.stats.violations += found[:5]
                self.blame(snaps, found)
                for uid in {e.split()[0] for e in found} - set(CAPACITY):
                    self.said(uid, f"checker: {[e for e in found if e.startswith(uid)]}")
            await asyncio.sleep(0.01)

    def truth_fits(self, uid: str, mine: PodUsage) -> None:
        """The pods the API holds bound (the truth, `mine` just committed) fit each card `mine` takes: every Binding
        is committed only while its booking is there, and bookings never over-commit a card, so pods that do run
        more than a card has (the ledger then holds it too, once each is observed)."""
        for i in mine.cards:
            limit = self.limits.get((mine.node, i))
            if limit is None:
                continue
            on = {u: t for u, t in self.truth.items() if t.node == mine.node and i in t.cards}
            used = (sum(t.memory for t in on.values()), sum(t.cores for t in on.values()),
                    sum(t.slices for t in on.values()))
            if any(x > cap for x, cap in zip(used, limit, strict=True)):
                e = (f"{uid}: Binding committed on {mine.node} {mine.cards}: the pods the API holds bound on card {i} "
                     f"use mem/cores/slices {used} of {limit}: {sorted(on)}")
                self.stats.violations.append(e)
                self.suspects |= set(on)
                for u in on:
                    self.said(u, f"truth: bound on {mine.node} card {i} as {uid} is committed: {used} of {limit}")

    def blame(self, snaps: dict[str, NodeSnapshot], found: list[str]) -> None:
        """For each card a violation names ("<node> card <i>: ..."), the pods booked on it now join the suspects
        (their story is told), with what each holds there."""
        for e in found:
            m = re.match(r"(\S+) card (\d+):", e)
            if m is None or m.group(1) not in snaps or e in self.blamed:
                continue
            self.blamed.add(e)  # (told once: the checker samples every 10 ms)
            node, card = m.group(1), int(m.group(2))
            on = {uid: r for uid, r in snaps[node].reservations.items() if card in r.cards}
            self.said(f"{node} card {card}", f"checker: {e}; booked there: "
                                             f"{ {u: (r.state, r.cards, r.mem, r.cores) for u, r in on.items()} }")
            self.suspects |= set(on) | {f"{node} card {card}", f"node {node}"}
            for uid, r in on.items():
                self.said(uid, f"checker: booked on {node} card {card} ({r.state}, cards {r.cards}, mem {r.mem}, "
                               f"cores {r.cores}), found over-full: {e}")

    async def setup(self, url: str) -> None:
        """Before the run (`url`: Redis through the proxy): the services a subclass adds."""

    async def teardown(self) -> None:
        """After the run, whatever its end."""

    async def settle(self) -> None:
        """After the run, Redis reached without loss again: what must end before the last checks."""

    async def run(self) -> None:
        pods = [self.new_pod(i) for i in range(self.n_pods)]
        gate = asyncio.Semaphore(10)  # pods in their life at once

        async def one(p: Pod) -> None:
            if p.long_lived:
                await self.pod(p)  # (it waits for `finish`: not holding a place of the gate)
                return
            async with gate:
                await self.pod(p)

        self.limits = {(n, i): (c.capacity, c.cores, c.slice_limit)
                       for n, snap in (await self.snapshots()).items() for i, c in snap.cards.items()}
        checker = asyncio.create_task(self.checker())
        reconciler = asyncio.create_task(self.reconciler())
        lives = [asyncio.create_task(one(p)) for p in pods]
        try:
            # every pod done but the long-lived ones waiting for `finish`
            while (left := [t for t in lives if not t.done()]) and len(left) > self.waiting:
                await asyncio.wait(left, timeout=0.1)
                for t in lives:
                    if t.done() and (e := t.exception()) is not None:
                        raise e
            await asyncio.wait_for(self._quiet(), 30)
            self.finish.set()
            await asyncio.gather(*lives)
        finally:
            self.done = True
            self.finish.set()
            for t in lives:
                t.cancel()
            await asyncio.gather(*lives, return_exceptions=True)
            await asyncio.gather(checker, reconciler, return_exceptions=True)

    async def _quiet(self) -> None:
        """Quiet (no bind in flight; the reconciler may still write): the ledger holds exactly the truth."""
        async with self.api:
            if self.proxy is not None and self.proxy.late:
                await self.expire_leaks()
            snaps = await self.snapshots()
            errs = self.problems(snaps, dict(self.truth), quiet=True)
            self.blame(snaps, errs)
            booked = {uid for s in snaps.values() for uid in s.reservations}
            errs += [f"{uid} booked ({snaps_where(snaps, uid)}) but not bound in the API"
                     for uid in sorted(booked - set(self.truth))]
            self.stats.violations += errs


    async def expire_leaks(self) -> None:
        """Once every held command ran and every hold passed, the pending bookings left (no attempt is in flight)
        are expired, as the janitor would: each must be of a pod a reserve of which came late or failed whole."""
        assert self.proxy is not None
        await self.proxy.idle.wait()
        await asyncio.sleep(HOLD_MS / 1000 + 0.2)
        for node in CAPACITY:
            gone = await self.direct.expire(node, 1.0)
            self.stats.leaked += len(gone)
            for uid in gone:
                self.said(uid, f"{node}: expired once quiet (a leak)")
                if uid not in self.proxy.late_uids | self.failed_places:
                    self.stats.violations.append(f"{uid} leaked on {node}: none of its commands came late nor "
                                                 f"failed whole")


def snaps_where(snaps: dict[str, NodeSnapshot], uid: str) -> str:
    return "; ".join(f"{n}: {s.reservations[uid]}" for n, s in snaps.items() if uid in s.reservations)


async def nothing_left(direct: Ledger) -> list[str]:
    snaps = await direct.snapshots(list(CAPACITY))
    errs = all_violations(snaps)
    errs += [f"{n}: {uid} still booked: {r}" for n, s in snaps.items() for uid, r in s.reservations.items()]
    errs += [f"{n} card {i}: used {c.mem_used}/{c.cores_used}/{c.slices} with nothing booked"
             for n, s in snaps.items() for i, c in s.cards.items() if c.mem_used or c.cores_used or c.slices]
    errs += [f"key {k} left" async for k in direct.redis.scan_iter(match="mt:*") if ":res:" in k]
    return errs


async def stress(server: RedisServer, seed: int, pods: int, cut: float = 0.06, delay: float = 0.03,
                 replicas: int = 3, late: float = 0.0, early: float = 0.0,
                 make: Callable[..., Run] = Run) -> Stats:
    """One seeded run of `make` (Run or a subclass, called as Run is) over the lossy proxy; returns its stats."""
    shas = tuple(hashlib.sha1(script_source(n).encode()).hexdigest() for n in ("reserve", "release"))  # EVALSHA's
    proxy = LossyProxy(server.port, seed, cut, delay, late=late, late_shas=shas)
    port = await proxy.start()
    pw = f":{server.password}@" if server.password else ""
    url = f"redis://{pw}127.0.0.1:{port}/0?socket_timeout={CLIENT_TIMEOUT}&socket_connect_timeout=1"
    clients: list[Redis] = [connect(url) for _ in range(replicas)]
    direct_client = Redis.from_url(server.url, decode_responses=True)
    try:
        direct = Ledger(direct_client)
        await direct_client.flushall()
        await direct.load_scripts()
        for inv in INVENTORIES:
            await direct.upsert_node(inv)
        leds = []
        for c in clients:
            led = Ledger(c)
            led.retry_seconds = 10.0
            await led.load_scripts()
            leds.append(led)
        run = make(seed, leds, direct, pods, proxy=proxy, early=early)
        await run.setup(url)
        proxy.armed = True
        try:
            await asyncio.wait_for(run.run(), RUN_LIMIT_S)
            proxy.armed = False
            await run.settle()
        finally:
            proxy.armed = False
            await run.teardown()
        run.stats.cut, run.stats.held, run.stats.late = proxy.cuts, proxy.delays, proxy.lates
        if late:  # the held commands of the last pods run, and their leaks expire
            await run.expire_leaks()
        run.stats.violations += await nothing_left(direct)
        named = {e.split()[0].rstrip(":") for e in run.stats.violations}
        if run.stats.violations:
            named |= run.suspects
        for uid in sorted(named & set(run.log) - set(CAPACITY))[:12]:
            run.stats.violations.append(f"{uid}'s story:\n  " + "\n  ".join(run.log[uid]))
        print(f"\nseed {seed}, {pods} pods: {run.stats.__dict__ | {'violations': len(run.stats.violations)}}; "
              f"replies {proxy.replies}")
        return run.stats
    finally:
        for c in clients:
            await c.aclose()
        await direct_client.aclose()
        await proxy.close()


@pytest.mark.parametrize("seed", SEEDS)
async def test_lost_replies_and_resends_keep_the_ledger_true(redis_server: RedisServer, ledger: Ledger,
                                                             seed: int) -> None:
    stats = await stress(redis_server, seed, PODS)
    assert stats.violations == [], "\n".join(stats.violations)
    # the run did what it is for: binds committed and given back, pods observed and released, rewrites, resends
    assert stats.committed > 10 and stats.given_back > 0 and stats.released > 10
    assert stats.rebuilds + stats.replaces > 0 and stats.samples > 0 and stats.cut > 0 and stats.held > 0


@pytest.mark.parametrize("seed", SEEDS)
async def test_late_commands_and_early_retries_keep_the_ledger_true(redis_server: RedisServer, ledger: Ledger,
                                                                    seed: int) -> None:
    stats = await stress(redis_server, seed, PODS, cut=0.04, delay=0.02, late=0.08, early=0.5)
    assert stats.violations == [], "\n".join(stats.violations)
    assert stats.committed > 10 and stats.given_back > 0 and stats.released > 10
    assert stats.late > 0 and stats.early > 0 and stats.samples > 0
