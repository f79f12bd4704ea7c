"""Red team (the janitor, node removals and stale mirrors under stress): the seeded, bounded stress of
tests/redis/test_redteam_resend_stress.py (its Run, lossy proxy and checks), with three more product paths running
concurrently with the binds, give-backs, confirmations and rewrites there:

* the janitor (controller/janitor.py, the real Janitor over the real expire.lua) sweeping every 0.1 s with a
  time-scaled pendingTTLSeconds, its `before_expire` wired to the real PodWatcher's `confirm_now` and `redis_time` to
  its `saw_redis_time` (as controller/roles.py `janitor_for` wires them). Binders die: after booking, before their
  Binding (the booking is the janitor's to end), or after their Binding was committed, before their confirmation
  (only the pod watcher's sight of the record, or its confirm_now when the janitor asks, marks it bound), and its
  `api_holds` to the watcher's own (the API server, asked about each booking left to expire, answers from the run's
  truth: a watch behind by more than the TTL's second half must not free a committed Binding's booking). Every
  timing the ledger relies on is the product's own, from the scaled TTL: the Binding's deadline is
  `bind_deadline_s(TTL)` (half the TTL) from the attempt's start, a Binding is not sent with less than
  BIND_MIN_LEFT_S of it left (its booking given back as controller/extender.py does) and is committed by the
  deadline or never, reserve's hold is the deadline plus BIND_SETTLE_S (extender `_hold_ms`), the watcher's grace is
  a quarter of the TTL (PodWatcher's own), the keep window is twice the deadline (the least timing.py allows);
* the pod watcher (the real PodWatcher) fed the pods' events as a watch would: in order, a little late (now and then
  by up to 0.4 TTL, the whole stream behind it), MODIFIED with the record the extender writes (binding_annotations)
  once a Binding is committed, DELETED once the pod is deleted; it books records (`observe`), defers our binds'
  confirmations and releases deleted pods (every replica's `observe` and `release` of the base run are its);
* node removals (controller/node_watch.py, the real NodeWatcher's `apply`, with its holders the pod watcher's view):
  now and then a Node is deleted from the API, at once or after a drain (kube-scheduler stops choosing it; binds
  already sent to it go on), and comes back a little later, as it was or with a card cordoned, unhealthy or gone; or
  its cards change so without a deletion (the watcher's upsert). `remove_node` with the keep window races with binds,
  Bindings, confirmations and releases there (a node still settling is written on placeholder cards instead); the
  reconciler's rebuild also removes nodes the API no longer lists;
* mirrors (shared/store/mirror.py, the real Mirror fed by Pub/Sub through the lossy proxy: its feed connection is
  cut and read again): each extender replica plans from its own mirror's snapshot and applies the feed messages its
  scripts hand back (as the extender does); the janitor and the pod watcher share another. A plan from a stale
  snapshot must never over-commit: reserve.lua checks again (the checker's card invariants).

Checked besides the base's invariants (no card over-committed, every pod bound in the API booked exactly, the ledger
equal to the truth once quiet, nothing left at the end; a Binding committed only while its booking is there): every
booking expire.lua releases (heard on the feed straight from Redis) is of a pod a binder abandoned, or one of whose
reserves failed whole (its command may have run), or one the API server said (asked by api_holds) its pod did not
hold (deleted since its Binding, the watch behind) -- any other was leaked by some path, or was a live pod's. Once
quiet, the janitor has expired every booking nobody holds (waited for, bounded).

A deleted pod's booking is also checked gone from its node as soon as the watcher handled the deletion (the
reconciler, which would heal a release sent elsewhere, runs often here: tests/redis/test_redteam_release_stale_owner.py
is such a release, reduced).

Bounded: the base's defaults (MTSCHED_STRESS_SEEDS, MTSCHED_STRESS_PODS), a few seconds a seed."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import re
import time
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis

from controller.janitor import Janitor
from controller.node_watch import NodeWatcher
from controller.pod_watch import PodWatcher
from deploy.local.redis import RedisServer
from shared.domain.annotations import CardGrant, PodUsage, binding_annotations, device_id
from shared.domain.models import UNIT_MIB
from shared.domain.node import Inventory
from shared.domain.state import NodeSnapshot
from shared.domain.timing import BIND_SETTLE_S, bind_deadline_s
from shared.kube import Kube, KubeError
from shared.serving.supervise import cancel_and_wait
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from shared.store.redis_conn import connect
from tests.redis.helpers import eventually, inventory
from tests.redis.stress_worker import CFG
from tests.redis.test_redteam_resend_stress import (
    CAPACITY,
    INVENTORIES,
    PODS,
    SEEDS,
    Pod,
    Run,
    Stats,
    stress,
)

pytestmark = pytest.mark.redis

# pendingTTLSeconds scaled down (the config takes 5..3600; expire.lua takes 1 s up): every other timing below is the
# product's relation to it
TTL = 2
JCFG = replace(CFG, pending_ttl_seconds=TTL)
DEADLINE = bind_deadline_s(TTL)  # a Binding's deadline from its attempt's start: half the TTL
HOLD_MS = int((DEADLINE + BIND_SETTLE_S) * 1000)  # reserve's hold_ms (Extender._hold_ms)
KEEP_MS = int(2 * DEADLINE * 1000)  # the keep window: the least timing.py allows for this deadline
SWEEP_S = 0.1  # the janitor's interval
# How long the checks wait for the janitor to have expired what nobody holds (a bound on waiting only: the wait ends
# as soon as it has). Its TTL, the hold and a few sweeps, when sweeps are quick; but a sweep also waits on the
# watcher's observes through the lossy proxy (cut, held and resent), and on a loaded 2-core machine one booking
# waited 11 s for its expiry. Within the base run's 30 s for being quiet (Run.run) with the churn's end before it.
EXPIRY_WAIT_S = 20.0
INVENTORY = {inv.node: inv for inv in INVENTORIES}


class _OverCommits(logging.Handler):
    """The watchers' over-commit log lines (pod_watch.py `_observe`): the pod each names joins the run's suspects
    (its story is told on a failure), with the line in its story; its node's churn story too."""

    LINE = re.compile(r"pod default/(\S+) over-commits card\(s\) \(([^)]*)\) on (\S+)")

    def __init__(self, run: Run) -> None:
        super().__init__(logging.ERROR)
        self.run = run

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            m = self.LINE.search(record.getMessage())
            if m is not None:
                uid, node = m.group(1), m.group(3)
                self.run.suspects |= {uid, f"node {node}"}
                self.run.said(uid, f"watcher: logged {record.getMessage()}")


@dataclass
class JanitorStats(Stats):
    died_before_binding: int = 0  # binders that died after booking, before their Binding
    died_after_commit: int = 0  # ... after their Binding was committed, before their confirmation
    expired: int = 0  # bookings expire.lua released (heard on the feed)
    sweeps: int = 0
    sweep_failures: int = 0  # sweeps that failed whole (the supervisor runs the loop again)
    asked: int = 0  # uids the janitor asked the watcher about (before_expire)
    kept_by_watcher: int = 0  # ... of which confirm_now told it to keep
    asked_api: int = 0  # uids it asked the API server about (api_holds: its GET of the pod)
    kept_by_api: int = 0  # ... of which the API server holds the pod bound there (the watch behind)
    events: int = 0  # pod events the watcher handled (replayed ones once)
    node_deletes: int = 0
    nodes_removed: int = 0  # remove_node forgot the node
    nodes_kept: int = 0  # ... or it was written on placeholder cards (something settling, or holders)
    node_returns: int = 0
    node_changes: int = 0  # Node updates: a card cordoned, unhealthy or gone (or back)
    stale_plans: int = 0  # plans made from a mirror snapshot older than Redis's node
    expired_bound: int = 0  # expiries heard while the API held the pod bound on that node
    behind_ms: int = 0  # the most an event was handled after its due (the watcher's own backlog, past its lag)


class JanitorRun(Run):
    """The base run, with the janitor, the real pod and node watchers, node removals and per-replica mirrors."""

    stats: JanitorStats

    def __init__(self, seed: int, replicas: list[Ledger], direct: Ledger, pods: int, **kw: Any):
        super().__init__(seed, replicas, direct, pods, **kw)
        self.stats = JanitorStats()
        self.hold_ms, self.keep_ms, self.deadline, self.commit_check = HOLD_MS, KEEP_MS, DEADLINE, True
        # the node churn draws from its own generator: the shared one is drawn from by every pod in whatever order the
        # event loop runs them, so how a run's few churn rounds went (a deletion or none) hung on the machine's load
        self.churn_rng = random.Random(f"churn {seed}")
        self.deleted: set[str] = set()  # nodes the API lists no more now
        self.current = dict(INVENTORY)  # each node's cards as its Node reports them now
        self.abandoned: set[str] = set()  # pods with a booking a dead binder left
        # (pod, node) of bookings the API server, asked before their expiry, said the pod does not hold (api_holds):
        # a booking left pending by a binder that died after its Binding, of a pod deleted since (the watch behind)
        self.let_go: set[tuple[str, str]] = set()
        self.events: asyncio.Queue[tuple[float, str, dict[str, Any]]] = asyncio.Queue()
        self.calm = False  # no more node deletions (once quiet)
        self.stopping = False  # the loops below end
        self.clients: list[Redis] = []
        self.mirrors: dict[int, Mirror] = {}  # id(replica) -> its extender's mirror
        self.tasks: list[asyncio.Task[Any]] = []
        self.writing: set[int] = set()  # the node writes (the churn's NodeWatcher.apply) in flight, by id
        self.checks: set[asyncio.Task[None]] = set()  # _released, of the deletions handled (until each is done)
        self.write_ids = itertools.count()

    # -- setup -----------------------------------------------------------------------------------------------

    def _client(self, url: str) -> Redis:
        c = connect(url)
        self.clients.append(c)
        return c

    async def _ledger(self, url: str) -> Ledger:
        led = Ledger(self._client(url))
        led.retry_seconds = 10.0
        await led.load_scripts()
        return led

    async def _mirror(self, url: str, feed_url: str) -> Mirror:
        m = Mirror(await self._ledger(url), subscriber=self._client(feed_url), resync_seconds=1.0)
        await m.start()
        await asyncio.wait_for(m.ready.wait(), 10)
        return m

    async def setup(self, url: str) -> None:
        feed_url = url.split("?")[0] + "?socket_connect_timeout=1"  # (a subscriber waits: no socket timeout)
        for led in self.replicas:
            self.mirrors[id(led)] = await self._mirror(url, feed_url)
        self.role_mirror = await self._mirror(url, feed_url)
        kube = Kube(None)
        self.watcher = PodWatcher(kube, await self._ledger(url), self.role_mirror, JCFG, asyncio.Event())
        self.watcher.nudger.nudge = lambda node: None  # type: ignore[method-assign]  # (no API server to patch)
        self.janitor = Janitor(await self._ledger(url), self.role_mirror, JCFG, interval=SWEEP_S,
                               before_expire=self._before_expire, redis_time=self.watcher.saw_redis_time,
                               api_holds=self._api_holds)
        kube.get_pod = self._get_pod  # type: ignore[method-assign]  # the API server's pods: the run's truth
        self.nodes = NodeWatcher(kube, await self._ledger(url), JCFG, keep_ms=KEEP_MS)
        self.nodes.holders = self.watcher.holders
        self.nodes.ended = lambda: self.watcher.ended  # (as controller/watchers.py `wire`)
        self.nodes.known = set(CAPACITY)
        self.overcommits = _OverCommits(self)
        logging.getLogger("mtsched.watchers").addHandler(self.overcommits)
        self.feed = self.direct.redis.pubsub()  # expire.lua's releases, heard straight from Redis
        await self.feed.subscribe(self.direct.keys.feed)
        self.tasks = [asyncio.create_task(t) for t in (self._stream(), self._sweeping(), self._confirming(),
                                                         self._churn(), self._expiries())]

    async def teardown(self) -> None:
        self.stopping = True
        if hasattr(self, "overcommits"):
            logging.getLogger("mtsched.watchers").removeHandler(self.overcommits)
        # (a cancel can be swallowed on its way through a Redis call: sent again, bounded; the loops also end by
        # `stopping`)
        left = await cancel_and_wait([*self.tasks, *self.checks], grace=10)
        assert not left, f"tasks that would not end: {left}"
        for m in [*self.mirrors.values(), getattr(self, "role_mirror", None)]:
            if m is not None:
                with contextlib.suppress(Exception):
                    await m.stop()
        if hasattr(self, "feed"):
            await self.feed.aclose()
        for c in self.clients:
            await c.aclose()

    # -- the hooks of the base run ---------------------------------------------------------------------------

    def inventories(self) -> list[Inventory]:
        return [self.current[inv.node] for inv in INVENTORIES if inv.node not in self.deleted]

    async def plan_snapshot(self, led: Ledger, node: str) -> NodeSnapshot | None:
        snap = self.mirrors[id(led)].get(node)
        fresh = await self.direct.snapshot(node)
        if snap is not None and fresh is not None and (snap.version, snap.stamp) != (fresh.version, fresh.stamp):
            self.stats.stale_plans += 1
        return snap

    def heard(self, led: Ledger, feed: Any) -> None:
        if feed:
            with contextlib.suppress(KeyError, TypeError, ValueError, AttributeError):
                self.mirrors[id(led)].apply(feed)  # as Extender._apply_feed

    def crashes(self, pod: Pod, node: str, where: str) -> bool:
        if where == "before_binding" and self.rng.random() < 0.1:
            self.stats.died_before_binding += 1
            self.abandoned.add(pod.uid)
            return True
        if where == "after_commit" and self.rng.random() < 0.15:
            self.stats.died_after_commit += 1
            return True
        return False

    def committed(self, pod: Pod, mine: PodUsage) -> None:
        body = self.pod_json(pod, mine)
        self._push("MODIFIED", body)
        if self.rng.random() < 0.5:  # its status follows (the same record)
            self._push("MODIFIED", {**body, "status": {"phase": "Running"}})

    async def watched(self, pod: Pod, usage: PodUsage) -> None:
        return None  # the pod watcher sees it on its stream

    async def delete(self, pod: Pod, usage: PodUsage) -> None:
        del self.truth[pod.uid]
        self._push("DELETED", self.pod_json(pod, usage))

    # -- the pods' events, as a watch delivers them -----------------------------------------------------------

    @staticmethod
    def pod_json(pod: Pod, usage: PodUsage) -> dict[str, Any]:
        """The pod bound with the record the extender writes for `usage` (controller/extender.py `_grants`)."""
        grants = [[CardGrant(device_id(usage.node, i), s.memory * UNIT_MIB, s.cores) for i in usage.cards]
                  if not s.empty else [] for s in pod.req.shares_for(CAPACITY[usage.node])]
        meta = {**pod.spec["metadata"], "name": pod.uid, "uid": pod.uid,
                "annotations": binding_annotations(usage.node, grants, 0)}
        return {"metadata": meta, "spec": {**pod.spec["spec"], "nodeName": usage.node,
                                           "schedulerName": JCFG.scheduler_name}, "status": {"phase": "Pending"}}

    def _push(self, kind: str, body: dict[str, Any]) -> None:
        lag = self.rng.uniform(0, 0.05) if self.rng.random() < 0.9 else self.rng.uniform(0, 0.4 * TTL)
        self.events.put_nowait((time.monotonic() + lag, kind, body))

    async def _stream(self) -> None:
        """The pod watch: each event in order, once its lag passed (a late one holds back those after it)."""
        while not self.stopping:
            at, kind, body = await self.events.get()
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            uid = body["metadata"]["uid"]
            for _ in range(50):
                try:
                    await self.watcher.on_event(kind, body)
                    break
                except Exception as e:  # Redis away past the ledger's resends: the event is handled again
                    self.stats.call_failures += 1
                    self.said(uid, f"watcher: {kind} failed ({e!r}), again")
                    await asyncio.sleep(0.02)
            else:
                self.stats.violations.append(f"{uid}: the watcher's {kind} failed 50 times")
            self.stats.events += 1
            self.stats.behind_ms = max(self.stats.behind_ms, int((time.monotonic() - at) * 1000))
            self.stats.released += kind == "DELETED"
            if kind == "DELETED":  # judged beside the stream (it waits for the writes in flight): the watch goes on
                check = asyncio.create_task(self._released(uid, body["spec"]["nodeName"]))
                self.checks.add(check)
                check.add_done_callback(self.checks.discard)
            self.said(uid, f"watcher: {kind} handled ({time.monotonic() - at:.3f}s after its due "
                           f"{at - self.t0:.3f})")
            self.events.task_done()

    async def _released(self, uid: str, node: str) -> None:
        """After the watcher handled a pod's deletion, the pod holds nothing on the node it was bound to (unless a
        command of it came late, or failed whole, and booked again: the janitor's) -- once the writes that read the
        pod view before that are done: a node write in flight then (NodeWatcher.apply, its holders read before its
        Redis calls) or the observe of the pod's held-back record (PodWatcher.confirm_due, beside the stream) may
        book the pod again after its release, and each gives it back as it ends (the product's; before, nothing did
        and the booking stayed until the reconciler judged it)."""
        before = set(self.writing)

        def done() -> bool:
            return not before & self.writing and uid not in self.watcher.confirming

        try:
            await eventually(done, 30, f"{uid}: the node writes and the observe in flight at its deletion ended")
        except AssertionError as e:
            self.stats.violations.append(str(e))
        snap = await self.direct.snapshot(node)
        assert self.proxy is not None
        if snap is not None and uid in snap.reservations and uid not in self.proxy.late_uids | self.failed_places:
            self.stats.violations.append(f"{uid} still booked on {node}, where it was bound, after the watcher "
                                         f"handled its deletion: {snap.reservations[uid]}")
            self.said(uid, f"{node}: still booked after its deletion was handled")

    async def _confirming(self) -> None:
        """PodWatcher.confirm_deferred, restarted after an error as its supervisor would."""
        while not self.stopping:
            with contextlib.suppress(Exception):
                await self.watcher.confirm_deferred()
            await asyncio.sleep(0.05)

    # -- the janitor ------------------------------------------------------------------------------------------

    async def _before_expire(self, uids: list[str]) -> set[str]:
        keep = await self.watcher.confirm_now(uids)
        self.stats.asked += len(uids)
        self.stats.kept_by_watcher += len(keep)
        for uid in uids:
            self.said(uid, f"janitor: due; the watcher {'keeps it' if uid in keep else 'lets it go'}")
        return keep

    async def _get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        """A GET of a pod (pods are named by their uid): bound as the API server holds it now, or 404."""
        usage = self.truth.get(name)
        if usage is None:
            raise KubeError(404, {"message": f"pods \"{name}\" not found"}, f"GET pod {namespace}/{name}")
        return {"metadata": {"name": name, "namespace": namespace, "uid": name},
                "spec": {"nodeName": usage.node, "schedulerName": JCFG.scheduler_name}, "status": {"phase": "Running"}}

    async def _api_holds(self, node: str, refs: dict[str, str]) -> set[str]:
        keep = await self.watcher.api_holds(node, refs)
        self.stats.asked_api += len(refs)
        self.stats.kept_by_api += len(keep)
        for uid in refs:
            if uid in keep:
                self.said(uid, f"janitor: the API server holds it bound on {node}: kept")
            else:  # (answered from the truth: its pod deleted, or bound nowhere or elsewhere, at the read)
                self.let_go.add((uid, node))
                self.said(uid, f"janitor: the API server does not hold it bound on {node}: let go")
        return keep

    async def _sweeping(self) -> None:
        while not self.stopping:
            try:
                await self.janitor.sweep()
                self.stats.sweeps += 1
            except Exception:  # (Janitor.run's supervisor restarts it)
                self.stats.sweep_failures += 1
            await asyncio.sleep(SWEEP_S)

    async def _expiries(self) -> None:
        """What expire.lua released: each must be a booking a dead binder left, or of a reserve that failed whole."""
        async for msg in self.feed.listen():
            if msg.get("type") != "message":
                continue
            body = orjson.loads(msg["data"])
            if body.get("kind") != "expire":
                continue
            uid, node = str(body.get("uid")), str(body.get("node"))
            self.stats.expired += 1
            self.said(uid, f"{node}: expired by the janitor")
            assert self.proxy is not None
            if uid not in self.abandoned | self.failed_places | self.proxy.late_uids and (uid, node) not in self.let_go:
                self.stats.violations.append(f"{uid}: its booking on {node} expired, though no binder left it")
            if uid in self.truth and self.truth[uid].node == node:
                # the booking of a pod the API holds bound there (or one bound there since, by an attempt that booked
                # anew after this expiry and before its message was heard here: hence a story line, not a violation):
                # if the card's room is taken before the pod's record is observed again, that observe over-commits
                self.stats.expired_bound += 1
                self.suspects.add(uid)
                self.said(uid, f"{node}: expired while the API holds it bound there")

    # -- node removals ----------------------------------------------------------------------------------------

    async def _pause(self, most: float) -> None:
        await asyncio.sleep(self.churn_rng.uniform(0, most))

    async def _churn(self) -> None:
        """Now and then a Node is deleted (at once, or after a drain: kube-scheduler chooses it no more), and comes
        back a little later; the node watcher handles both (under the reconciler's lock, as NodeWatcher.lock).
        A run has only a few rounds: the first deletes a node, whatever the seed, and the churn ends (once quiet) only
        after a deletion, so every run races one with the binds (the tests assert it did)."""
        first = True
        while True:
            await self._pause(0.8)
            if self.stopping or (self.calm and self.stats.node_deletes):
                return
            node = self.churn_rng.choice(sorted(CAPACITY))
            if not first and self.churn_rng.random() < 0.4:  # its cards change (a card cordoned, unhealthy or gone...)
                async with self.api:
                    self.current[node] = self._variant(node)
                    self.stats.node_changes += 1
                    await self.call("node changed", partial(self._apply, node, self.current[node]))
                continue
            first = False
            if self.churn_rng.random() < 0.5:  # drained first
                self.deleted.add(node)
                await self._pause(1.0)
            async with self.api:
                self.deleted.add(node)
                self.stats.node_deletes += 1
                removed = await self.call("node deleted", partial(self._apply, node, None))
                self.stats.nodes_removed += removed
                self.stats.nodes_kept += not removed
            await self._pause(0.8)
            await self._back(node)

    async def _apply(self, node: str, inv: Inventory | None) -> bool:
        known = node in self.nodes.known
        wid = next(self.write_ids)
        self.writing.add(wid)
        what = "deleted" if inv is None else f"cards {[(c.index, c.health) for c in inv.cards]}"
        self.said(f"node {node}", f"node watcher: {what} (holders {sorted(self.watcher.holders(node))})")
        try:
            await self.nodes.apply(node, inv)
        finally:
            self.writing.discard(wid)
        self.said(f"node {node}", f"node watcher: {what} written (known: {node in self.nodes.known})")
        return known and node not in self.nodes.known  # forgotten: remove_node removed it

    def _variant(self, node: str) -> Inventory:
        """The node's cards as its Node reports them next: as they were, or one of them cordoned, unhealthy or gone."""
        base, roll, card = INVENTORY[node], self.churn_rng.random(), self.churn_rng.choice([0, 1])
        cap, limit = CAPACITY[node], base.cards[0].max_slices
        if roll < 0.4:
            return base
        if roll < 0.6:
            return inventory(node, cap, slice_limit=limit, cordoned=[card])
        if roll < 0.8:
            return inventory(node, cap, slice_limit=limit, unhealthy=[card])
        return inventory(node, cap, slice_limit=limit, indices=[1 - card])

    async def _back(self, node: str) -> None:
        async with self.api:
            self.current[node] = self._variant(node)
            await self.call("node back", partial(self._apply, node, self.current[node]))
            self.deleted.discard(node)
            self.stats.node_returns += 1

    @staticmethod
    def problems(snaps: dict[str, NodeSnapshot], held: dict[str, PodUsage], quiet: bool = False) -> list[str]:
        """The base's, but a deleted node's placeholder cards ("removed": they keep what its holders and the bookings
        still settling there hold, whatever that adds up to) are over-full by design."""
        removed = tuple(f"{n} card {i}:" for n, s in snaps.items() for i, c in s.cards.items() if c.health == "removed")
        return [e for e in Run.problems(snaps, held, quiet) if not (e.startswith(removed) and " outside 0.." in e)]

    # -- quiet -----------------------------------------------------------------------------------------------

    async def _unheld(self, settled: bool) -> list[str]:
        """Bookings of pods the API does not hold bound there (a dead binder's booking of a pod bound on another
        node, too); all of them once `settled`."""
        snaps = await self.snapshots()
        return [f"{n}: {uid}" for n, s in snaps.items() for uid in s.reservations
                if settled or uid not in self.truth or self.truth[uid].node != n]

    async def _until(self, settled: bool, within: float) -> None:
        """The watcher's stream handled, and the janitor has expired what nobody holds (bounded: what is left is
        reported by the checks after)."""
        await asyncio.wait_for(self.events.join(), 30)
        await asyncio.gather(*list(self.checks))  # (each bounded)

        async def none_left() -> bool:
            return not await self._unheld(settled)

        with contextlib.suppress(AssertionError):
            await eventually(none_left, within, "the janitor expired every booking nobody holds")

    async def _quiet(self) -> None:
        self.calm = True
        await asyncio.wait_for(self.tasks[3], 30)  # the churn ends, its node back first
        await self._until(False, EXPIRY_WAIT_S)
        await super()._quiet()

    async def expire_leaks(self) -> None:
        """(The base's, with late commands: here the janitor expires them, as it runs; attributed as it does.)"""
        assert self.proxy is not None
        await self.proxy.idle.wait()
        await self._until(False, EXPIRY_WAIT_S)

    async def settle(self) -> None:
        await self._until(True, EXPIRY_WAIT_S)


@pytest.mark.parametrize("seed", SEEDS)
async def test_janitor_node_removals_and_stale_mirrors_keep_the_ledger_true(redis_server: RedisServer,
                                                                           ledger: Ledger, seed: int) -> None:
    stats = await stress(redis_server, seed, PODS, make=JanitorRun)
    assert isinstance(stats, JanitorStats)
    assert stats.violations == [], "\n".join(stats.violations)
    # the run did what it is for
    assert stats.committed > 5 and stats.given_back > 0 and stats.released > 5 and stats.cut > 0
    # (whether a dead binder's booking reaches the janitor depends on the run: the pod's retry may join it and
    # bind, a node's deletion or a rewrite may drop it first; what reaches it is checked in _quiet and _expiries)
    assert stats.died_before_binding + stats.died_after_commit > 0
    assert stats.sweeps > 10 and stats.node_deletes > 0 and stats.node_returns == stats.node_deletes
    assert stats.stale_plans > 0 and stats.samples > 0


@pytest.mark.parametrize("seed", SEEDS)
async def test_janitor_with_late_commands_and_early_retries_keeps_the_ledger_true(redis_server: RedisServer,
                                                                                 ledger: Ledger, seed: int) -> None:
    """The same, with the base's late commands (a reserve or a release run after its resend) and early retries."""
    stats = await stress(redis_server, seed, PODS, cut=0.04, delay=0.02, late=0.08, early=0.5, make=JanitorRun)
    assert isinstance(stats, JanitorStats)
    assert stats.violations == [], "\n".join(stats.violations)
    assert stats.committed > 5 and stats.released > 5 and stats.late > 0 and stats.early > 0
    assert stats.node_deletes > 0 and stats.node_returns == stats.node_deletes
