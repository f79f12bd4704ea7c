"""The node watcher: keeps each node's cards in the ledger as the Node object reports them."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from prometheus_client import Gauge

from controller.knob_watch import KnobWatch
from controller.mismatch import EVENT_NAMESPACE, MismatchReporter
from controller.reflector import Reflector
from shared.config import Config
from shared.domain.annotations import PodUsage
from shared.domain.coalesce import Coalescer, Offered, Pending
from shared.domain.node import Card, Inventory, node_inventory, offers_more
from shared.domain.node_stuck import stuck_error, stuck_event, stuck_retry_in
from shared.domain.reconcile import offers_cards
from shared.domain.resource_version import listed_over
from shared.domain.timing import KEEP_MS, NODE_EVENT_MIN_INTERVAL_S
from shared.kube import Kube, KubeError
from shared.serving.metrics import RELEASES, WATCH_COALESCED, WATCH_DEFERRED, WATCH_EVENTS
from shared.serving.supervise import is_transient
from shared.serving.waits import within
from shared.store.ledger import KEEP_MS_MAX, Ledger

log = logging.getLogger("mtsched.watchers")


Holders = Callable[[str], dict[str, tuple[PodUsage, str]]]
# A keep window as long as the scripts allow (24 h): every booking is kept (see NodeWatcher.view_problem)
KEEP_ALL_MS = KEEP_MS_MAX
# At most one line this often says which nodes had their changes held back (NodeWatcher.offer)
THROTTLE_LOG_EVERY_S = 10.0
NodeEvent = tuple[str, dict[str, Any]]  # (the watch event's type, the Node)
NODES_UNWRITTEN = Gauge("mtsched_nodes_unwritten",
                        "Nodes whose latest change the node watcher cannot write to the ledger for a reason no retry "
                        "cures soon (Redis refuses that node's write, a bug on the Node's shape): closed in the ledger "
                        "(offers nothing), tried again with backoff (should stay 0)")


@dataclass(frozen=True)
class Stuck:
    """A node whose latest change could not be written for a reason no retry cures soon (NodeWatcher._stuck)."""

    reason: str  # the first failure's (kept: the error the ledger holds does not change at each try)
    attempt: int  # tries failed so far, less one (the backoff's exponent)
    closed: bool  # whether the ledger holds it closed (or offers nothing of it): if not, readiness says so


class NodeWatcher:
    """Keeps each node's cards in the ledger as the Node object reports them.

    A node new to the ledger is written with the usage of the pods that hold cards there (`holders`,
    from the pod watcher's view), so a node deleted and re-created under running pods is never
    offered empty; so is a node that opens again after an error or a quarantine (the holders whose usage
    is recovered from their cards are none of a closed node's). A node that stops reporting cards
    (deleted, or its capacity dropped to 0) keeps its holders' usage, and the bookings still settling
    there (binds in flight, bindings this view has not seen yet), on placeholder cards until they are
    gone. While the pod view cannot be trusted (`view_problem`: its stream is down or not listed yet) it
    judges no booking: every one is kept, and the reconciler, which confirms with the API server, judges
    them once the view is live again.
    """

    def __init__(self, kube: Kube, ledger: Ledger, cfg: Config, keep_ms: int = KEEP_MS,
                 min_interval: float = NODE_EVENT_MIN_INTERVAL_S):
        self.kube = kube
        self.ledger = ledger
        self.cfg = cfg
        self.keep_ms = keep_ms
        self.last: dict[str, Inventory] = {}  # what this watcher last wrote, per node (the API's view)
        self.listed = False  # whether a list of the nodes was applied (on_sync)
        # `last` as it was before a re-list that failed part-way (Redis away): the baseline the next re-list compares
        # with, its nodes' room (the failed one emptied `last` and wrote only some of them); None once one succeeded
        self.unlisted: dict[str, Inventory] | None = None
        self.known: set[str] = set()  # nodes this watcher has seen in the ledger
        self.lost = asyncio.Event()  # set when Redis turned out to have lost a known node
        self.holders: Holders = lambda node: {}
        # pods the pod view saw end (uid -> when), its `ended`: a holder among them was released by the pod watcher
        self.ended: Callable[[], Mapping[str, float]] = dict
        self.view_problem: Callable[[], str] = lambda: ""  # why `holders` cannot be trusted now ("" if it can)
        self.quarantine: Callable[[str], str] = lambda node: ""  # why the node must offer nothing, if so
        # The stream's events wait here, per node, for `run_events` (a supervised task of the role) to handle them:
        # a node's burst collapses to its newest state, handled at most once per `min_interval`, the nodes in turn
        # (shared/domain/coalesce.py). Handled as they came, one node changed in a tight loop held the whole core.
        self.events: Coalescer[NodeEvent] = Coalescer(min_interval)
        self.clock: Callable[[], float] = time.monotonic  # the queue's time (a test's own clock)
        self._offered = asyncio.Event()  # set by offer: run_events looks again
        self.handled = 0  # events run_events handled (a re-list's nodes not counted)
        # node -> since when run_events fails to handle its change (Redis away, or a node that cannot even be closed),
        # for readiness: by node, so another node handled meanwhile does not make a failing one look handled
        self.failing: dict[str, float] = {}
        # nodes whose change fails for a reason no retry cures soon: closed in the ledger (`effective`), the role ready
        # for the others (a whole role unready for one bad Node stopped every node's repair, and, every watcher
        # replica meeting the same Node, the upkeep stamp: every extender then placed nothing, cluster-wide)
        self.stuck: dict[str, Stuck] = {}
        self._reports: set[asyncio.Task[None]] = set()
        self.last_error = ""
        # after each handling that works: the role's Supervisor.progress (controller/roles.py spawn_node_events)
        self.on_progress: Callable[[], None] = lambda: None
        self._throttled: Counter[str] = Counter()  # nodes held back since the last line that said so, how often
        self._said_throttled = float("-inf")
        self._held: set[str] = set()  # nodes whose pending change was held back (DEFERRED), until it is taken
        self.reflector = Reflector(kube, "/api/v1/nodes", self.offer, self.on_sync, "nodes")
        self.knobs = KnobWatch(kube, cfg.events_enabled, cfg.scheduler_name)  # knob changes under held slices
        self.nudge: Callable[[str], None] = lambda node: None  # the pod watcher's Nudger, set by the role
        # a node written (replace_node's answer) but perhaps not verified yet (Redis's history changed): compared
        # again later (the reconciler's verify_later, set by the role)
        self.verify_later: Callable[[str, Mapping[str, Any]], None] = lambda node, written: None
        self.vanished: set[str] = set()  # known nodes found missing from Redis when removed (apply, _replace)
        # nodes this watcher last wrote closed (an error, a quarantine, no card reported: deleted, capacity 0): the
        # view's holders of such a node lack the pods whose usage is recovered from their cards (no record,
        # shared.domain.reconcile.recovered_usage), so one that opens again is written whole with its holders
        # (_replace), not upserted over what it kept
        self.closed: set[str] = set()
        # node -> what the last write of a node that offers no card under held pods was made from (its Inventory or
        # None, the holders, whether the view was stale): each later event of the Node (status updates, anyone's
        # label) wrote it whole again and every mirror re-read it, for as long as the pods ran (red team)
        self.kept: dict[str, tuple[Inventory | None, dict[str, tuple[PodUsage, str]], bool]] = {}
        self.mismatch = MismatchReporter(kube, cfg)  # events, gauge and log line (controller/mismatch.py)
        # Held by each event and re-list, and by the reconciler's rebuild from its own lists: a Node change
        # handled while a rebuild runs would be overwritten by the rebuild's older copy (in Redis and in
        # `last`, which every later pass compares with). Held, the change is handled after the rebuild.
        self.lock = asyncio.Lock()
        # the resourceVersion of the last node list a rebuild wrote (`supersede`): an event no newer than it, which a
        # lagging stream delivers after the rebuild, is an older state of its node than the one written
        self.written_rv = ""

    def supersede(self, list_rv: str, mark: int) -> list[str]:
        """The reconciler's rebuild wrote every node from its own list (resourceVersion `list_rv`, requested when the
        queue had taken `mark` offers), under `lock`: the queued events no newer than that list are dropped, as a
        re-list drops them (on_sync). Handled after it, such an event wrote an older state of its node (cards,
        health, error) over the newer one the rebuild wrote, and `last` with it, which the reconciler compares
        with: it stood until the node's next event was handled. By resourceVersion where it is comparable, else
        by the order things came (an event received before the list was requested is no newer than it)."""
        dropped = self.events.drop(functools.partial(_listed_over, list_rv=list_rv, mark=mark))
        for name in dropped:
            self._held.discard(name)
            # (its change is in the list's view, written: a node whose change could not be written is open again)
            self.failing.pop(name, None)
            self.stuck.pop(name, None)
        if not self.failing:
            self.last_error = ""
        NODES_UNWRITTEN.set(len(self.stuck))
        self.written_rv = list_rv
        if dropped:
            log.info("rebuild: %d queued node change(s) no newer than its node list dropped: %s", len(dropped),
                     ", ".join(sorted(dropped)[:5]))
        return dropped

    def stuck_past(self, list_rv: str, mark: int) -> set[str]:
        """The stuck nodes whose queued change is newer than a rebuild's list (`supersede` keeps it): the rebuild writes
        them closed (`effective`). Written open from the list, such a node offered a state older than the Node's while
        taken as closed (`Stuck.closed`: its next failed try closed nothing), until a reconcile pass closed it."""
        return {n for n in self.stuck if (p := self.events.pending.get(n)) is not None
                and not _listed_over(p, list_rv, mark)}

    async def apply(self, name: str, inv: Inventory | None) -> None:
        """Bring the ledger's node `name` to what the API says (`inv`; None: the Node is gone)."""
        if inv is not None and self.last.get(name) == inv:
            return  # heartbeats and unrelated status changes don't touch the ledger
        if inv is not None and inv.error:
            log.warning("node %s offers no card: %s", name, inv.error)
        keep_ms = self.keep_ms
        stale = self.view_problem()
        if stale:
            # the view may lack pods bound long ago (a stream down for longer than the keep window): a
            # booking no holder explains is not judged by it (as the reconciler waits for live views)
            keep_ms = KEEP_ALL_MS
        if not offers_cards(inv):
            self.last.pop(name, None)
            holders = self.holders(name)
            if not holders and (name in self.known or inv is None):
                # forgotten, unless a booking still settles there (a bind in flight, or one this view has
                # not seen yet): its Binding and record come whatever the ledger says
                removed = await self.ledger.remove_node(name, keep_ms)
                if removed is not None:
                    if removed is False and name in self.known and inv is not None:
                        # a node we knew was not in Redis: another watcher removed it, or Redis lost it with a
                        # booking a bind in flight may hold. Written again, it waits the keep window (_replace)
                        self.vanished.add(name)
                    elif inv is None:
                        self.vanished.discard(name)  # gone from the API: nothing comes back to wait for
                    self.known.discard(name)
                    self.closed.discard(name)
                    self.kept.pop(name, None)
                    return
            elif not holders:
                return
            written = (inv, holders, bool(stale))
            if name in self.known and self.kept.get(name) == written:
                return  # written so already: nothing this event says changes it (the reconciler compares it)
            log.warning("node %s reports no sliced card while %d pod(s) hold cards there or bookings are in "
                        "flight: their usage is kept until they end%s", name, len(holders),
                        f" (every booking is kept: the pod view is not live, {stale})" if stale else "")
            # (written without the holders whose usage is recovered from its cards): remembered before the write,
            # which may take effect though its reply is lost
            self.closed.add(name)
            await self.ledger.list_node(name)
            await self._replace(Inventory(name), holders, keep_ms, stale, lost=name in self.known)
            self.known.add(name)
            self.kept = {n: w for n, w in self.kept.items() if n in self.known}  # (nodes removed since: forgotten)
            self.kept[name] = written
            return
        self.kept.pop(name, None)
        assert inv is not None
        was = self.last.get(name)
        self.last[name] = inv
        try:
            await self._write_open(name, self.effective(inv), keep_ms, stale)
        except BaseException:
            # not written (Redis away): the reflector replays the event, or lists again, and that must write it, and
            # see the room it offers (taken as written, the replay wrote nothing and nudged nobody)
            if was is None:
                self.last.pop(name, None)
            else:
                self.last[name] = was
            raise

    async def _write_open(self, name: str, inv: Inventory, keep_ms: int, stale: str) -> None:
        """apply's write of a node that offers cards (or is closed by an error), `inv` as the ledger must hold it."""
        # open again after an error, a quarantine or no card (deleted, capacity 0): written closed without the
        # holders recovered from their cards (by this watcher, or one that started while it was closed); while
        # closed by an error it is upserted, keeping whatever the ledger holds. Forgotten as closed only once it is
        # written open: a write that failed (the handler fails, the reflector lists again) is made whole again
        reopened = name in self.closed and not inv.error
        if inv.error:
            self.closed.add(name)
        if name in self.known:
            if reopened:  # written whole with its holders below, if Redis still has it (a read, on a rare change)
                missing = await self.ledger.snapshot(name) is None
            else:
                missing = await self.ledger.upsert_node(inv, create=False) < 0
            if missing:
                # A node we knew is missing from Redis: the state was lost, or another replica forgot the
                # node (it went and nothing was held there any more). Only a rebuild from fresh lists may
                # recreate it: this event may be older than the node's DELETE, and a lost shard loses others.
                log.error("node %s is missing from Redis: state lost, rebuilding from the API server", name)
                self.last.pop(name, None)
                self.lost.set()
                return
            if reopened:
                await self._replace(inv, self.holders(name), keep_ms, stale, lost=True)
        else:
            # New to us: written whole, with its holders' usage, before any replica can offer it.
            await self.ledger.list_node(name)
            await self._replace(inv, self.holders(name), keep_ms, stale)
        self.known.add(name)
        if not inv.error:
            self.closed.discard(name)

    async def _replace(self, inv: Inventory, holders: Mapping[str, tuple[PodUsage, str]], keep_ms: int,
                       stale: str, lost: bool = False) -> None:
        """replace_node from this watcher's view: a node Redis's history change left unverified is verified
        by it only while the pod view is live (else by the reconciler, which waits for live views). `lost`:
        a node this watcher knew, which Redis may lack (it then waits the keep window)."""
        lost = lost or inv.node in self.vanished
        out = await self.ledger.replace_node(inv, holders, keep_ms, keep_bound=True,
                                             verify_after_ms=self.keep_ms if not stale else None, lost=lost)
        self.vanished.discard(inv.node)
        self.verify_later(inv.node, out)
        # `holders` was read before this write's Redis calls
        await self.release_ended(inv.node, holders, self.ended(), "the node was written")

    async def release_ended(self, node: str, holders: Mapping[str, tuple[PodUsage, str]],
                            ended: Collection[str], during: str) -> list[str]:
        """After a write of `node` with `holders` read before it (this watcher's, the reconciler's repair): a holder
        whose pod ended meanwhile was released by the pod watcher, perhaps before the write reached Redis. Its
        release tombstoned it (shared/domain/ended.py), so the write did not book it (replace_node's `ended`).
        Given back again all the same, a belt (a release of what is not booked changes nothing): a release from a
        replica of an older release leaves no tombstone, nor does one made while Redis did not hold the node, and a
        Redis that lost the end of its writes may lack it; nothing else would release such a booking until the
        reconciler judged it (reconcileSeconds later). Returns the uids given back (kube-scheduler nudged)."""
        freed = []
        for uid in [u for u in holders if u in ended]:
            if await self.ledger.release(node, uid, ended=True):
                RELEASES.labels("gone").inc()
                log.info("released %s (%s) on %s: its pod ended while %s", holders[uid][1], uid, node, during)
                freed.append(uid)
        if freed:
            self.nudge(node)
        return freed

    def effective(self, inv: Inventory) -> Inventory:
        """The node as the ledger must hold it: closed (an error) while pods nobody can account for hold
        cards there, or while its latest change cannot be written (`stuck`: its last written state is not the
        Node's)."""
        if inv.error or not inv.cards:
            return inv
        stuck = self.stuck.get(inv.node)
        why = stuck_error(stuck.reason) if stuck is not None else self.quarantine(inv.node)
        return replace(inv, error=why) if why else inv

    async def offer(self, kind: str, node: dict[str, Any]) -> None:
        """The stream's event: queued for `run_events` (O(log n), whatever the node's size), superseding the node's
        pending one. The reflector counts it received (its resourceVersion) at once: one run_events fails to handle
        is put back and handled again, and a re-list supersedes every pending one."""
        name = str((node.get("metadata") or {}).get("name"))
        if self.written_rv and listed_over(str((node.get("metadata") or {}).get("resourceVersion") or ""),
                                           self.written_rv, False):
            return  # a lagging stream's older state of a node a rebuild wrote newer (supersede)
        now = self.clock()
        outcome = self.events.offer(name, (kind, node), now, deleted=kind == "DELETED")
        flapping = False
        if outcome is Offered.COALESCED:
            WATCH_COALESCED.labels("node").inc()
            # Named only when changed again while held back: one change within the interval is routine (our own
            # nudger writes a Node half a second after a change that offers more room was handled, controller/nudger.py)
            flapping = name in self._held
        elif outcome is Offered.DEFERRED:
            WATCH_DEFERRED.labels("node").inc()
            self._held.add(name)
        if name in self._held:
            self._throttled[name] += 1
        if flapping and now - self._said_throttled >= THROTTLE_LOG_EVERY_S:
            top = ", ".join(f"{n} x{c}" for n, c in self._throttled.most_common(5))
            more = len(self._throttled) - 5
            log.warning("node %s changes faster than the node watcher handles a node (once per %gs): its changes "
                        "are coalesced to the newest. Held back since the last such line: %s%s", name,
                        self.events.min_interval, top, f" and {more} more node(s)" if more > 0 else "")
            self._throttled.clear()
            self._said_throttled = now
        self._offered.set()

    async def run_events(self) -> None:
        """Handle the queued events (offer) until cancelled: each node's newest, in turn. A supervised task; a
        handling that fails is put back to wait its node's interval (`_handle_pending`): a transient failure (Redis
        away) is raised too, and the task restarted with backoff; any other is logged and the task runs on."""
        while True:
            self._offered.clear()
            delay = self.events.wait(self.clock())
            if delay is None or delay > 0:
                with contextlib.suppress(TimeoutError):  # (a node that was quiet may come meanwhile: ready at once)
                    await within(self._offered.wait(), delay)
                continue
            async with self.lock:  # (taken under the lock: a re-list, which clears the queue, holds it too)
                p = self.events.take(self.clock())
                if p is not None:
                    self._held.discard(p.key)
                    await self._handle_pending(p)
            await asyncio.sleep(0)  # the stream, and the role's other tasks, run between two nodes

    @property
    def failing_since(self) -> float | None:
        """Since when a node's change has not been handled for failures (None: none fails)."""
        return min(self.failing.values(), default=None)

    async def _handle_pending(self, p: Pending[NodeEvent]) -> None:
        # a closed node's change is tried as the Node is, not closed (`stuck` left out of `effective` for the try), and
        # written whatever `last` says (the ledger holds it closed): its `last` is set aside meanwhile
        stuck = self.stuck.pop(p.key, None)
        before = self.last.pop(p.key, None) if stuck is not None else self.last.get(p.key)
        try:
            if p.gone is not None:  # deleted, then created again: forgotten first, as the two events would have
                await self._on_event("DELETED", p.gone[1])
                self.handled += 1
                p.gone = None
            await self._on_event(*p.value)
            self.handled += 1
        except BaseException as e:
            if stuck is not None:
                self.stuck[p.key] = stuck  # (the try wrote nothing: the ledger holds it closed still)
                if before is not None and p.key not in self.last:
                    self.last[p.key] = before
            if isinstance(e, Exception) and not is_transient(e):
                await self._stuck(p.key, e, before, str((p.value[1].get("metadata") or {}).get("uid") or ""))
                self.events.put_back(p, self._retry_at(p.key))
                return
            # Tried again in the node's turn, once its interval is over: put back first in line, ready at once, a
            # node whose writes fail while the others' work (one shard of a Redis Cluster away, a refusal of its
            # write) was taken first again at each restart of the task, every other node's change waiting behind it.
            # A failure no retry cures soon (a refusal, a bug on its Node's shape) is not raised either: raised, it
            # failed at each restart, and after 5 in a row the supervisor ended the role (the reflector, which handled
            # the events before, listed again instead)
            if not isinstance(e, Exception):  # (cancelled: the role stops, or the task is restarted)
                self.events.put_back(p)
                raise
            self.events.put_back(p, self.clock() + self.events.min_interval)
            self.failing.setdefault(p.key, self.clock())
            self.last_error = f"{type(e).__name__}: {e}"[:300]
            raise
        self.failing.pop(p.key, None)
        if not self.failing:
            self.last_error = ""
        if stuck is not None:
            NODES_UNWRITTEN.set(len(self.stuck))
            log.warning("node %s: its change is written (%s failed before): the node is open to placement again as "
                        "the Node says", p.key, stuck.reason)
        self.on_progress()

    async def _stuck(self, name: str, e: Exception, before: Inventory | None, uid: str) -> None:
        """`name`'s change failed for a reason no retry cures soon (Redis refuses the node's write, a bug on the Node's
        shape): the node is closed in the ledger, its last written state (`before`) with an error, so nothing is
        placed on a state we know is old (fail closed); reported (gauge, Warning Event, log) and tried again with
        backoff (`_retry_at`). The role stays ready for the other nodes; only a node that cannot even be closed
        counts against readiness (`failing`), and is tried at each interval."""
        reason = f"{type(e).__name__}: {e}"[:300]
        was = self.stuck.get(name)
        if before is not None and name not in self.last:
            self.last[name] = before  # (a deletion that failed: the ledger still holds what was written)
        stuck = Stuck(was.reason if was else reason, was.attempt + 1 if was else 0, bool(was and was.closed))
        self.stuck[name] = stuck  # (first: `effective` closes it)
        if not stuck.closed:
            stuck = replace(stuck, closed=await self._close(name))
            self.stuck[name] = stuck
        if stuck.closed:
            self.failing.pop(name, None)
        else:
            self.failing.setdefault(name, self.clock())
            self.last_error = f"node {name} not even closed: {reason}"
        if not self.failing:
            self.last_error = ""
        NODES_UNWRITTEN.set(len(self.stuck))
        if was is None:
            log.error("node %s: its change cannot be written (%s); the node is %s, tried again with backoff (up to "
                      "every %gs) until a state of it is written", name, reason,
                      "closed in the ledger (offers nothing)" if stuck.closed else
                      "NOT closed in the ledger either (readiness says so)",
                      stuck_retry_in(99, self.events.min_interval), exc_info=e)
            self._report(name, reason, uid)
        else:
            log.debug("node %s: its change still cannot be written (%s)", name, reason)

    def _retry_at(self, name: str) -> float:
        """When a stuck node's change is tried again: with backoff once it is closed, else at its next interval."""
        stuck = self.stuck.get(name)
        if stuck is None or not stuck.closed:
            return self.clock() + self.events.min_interval
        return self.clock() + stuck_retry_in(stuck.attempt, self.events.min_interval)

    async def _close(self, name: str) -> bool:
        """Write `name` as last written, closed (`effective`, under `stuck`); whether the ledger offers nothing of it
        now (a node this watcher never wrote, or written offering no card, offers nothing already)."""
        inv = self.last.get(name)
        if inv is None:
            return await self._close_held(name)
        if not offers_cards(inv):
            return True
        stale = self.view_problem()
        try:
            await self._write_open(name, self.effective(inv), KEEP_ALL_MS if stale else self.keep_ms, stale)
        except Exception as e:
            log.error("node %s: could not be closed in the ledger either (%s): pods may still be placed on its last "
                      "written state", name, e)
            return False
        return True

    async def _close_held(self, name: str) -> bool:
        """`_close` of a node this watcher never wrote (it just started: a restart, a new replica): the ledger may hold
        it open as another watcher wrote it, a state older than the Node's, which taken as closed stayed offered
        (tests/redis/test_redteam_stuck_restart.py). Written closed on the cards the ledger holds (upserted: its
        bookings kept as they are); whether it offers nothing now."""
        try:
            snap = await self.ledger.snapshot(name)
            if snap is None or snap.error:
                return True  # (not in the ledger, or closed there already)
            held = tuple(Card(name, r.index, r.capacity, r.slice_limit, healthy=r.health != "unhealthy",
                              cordoned=r.health == "cordoned", cores=r.cores, knobs=r.knobs)
                         for r in snap.cards.values() if r.health != "removed")
            inv = self.effective(Inventory(name, held))
            if not inv.error:
                return True  # (no card it reports: it offers nothing)
            self.closed.add(name)  # (opened again, it is written whole with its holders: _write_open)
            await self.ledger.upsert_node(inv, create=False)  # (gone meanwhile, -1: nothing to close)
        except Exception as e:
            log.error("node %s: could not be closed in the ledger either (%s): pods may still be placed on its last "
                      "written state", name, e)
            return False
        return True

    def _report(self, name: str, reason: str, uid: str) -> None:
        """The Warning Event on the Node (best effort, in the background: a slow API server holds no node's turn)."""
        if not self.cfg.events_enabled:
            return
        body = stuck_event(name, uid, reason, self.cfg.scheduler_name,
                           datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), EVENT_NAMESPACE)

        async def send() -> None:
            try:
                await self.kube.request("POST", f"/api/v1/namespaces/{EVENT_NAMESPACE}/events", body,
                                        best_effort=True)
            except KubeError as e:
                if e.status != 409:  # 409: reported already (another replica, or this one before a restart)
                    log.warning("could not record the event of node %s: %s", name, e)
            except Exception as e:
                log.debug("could not record the event of node %s: %s", name, e)

        task = asyncio.create_task(send())
        self._reports.add(task)
        task.add_done_callback(self._reports.discard)

    def problem(self, max_failing: float = 10.0) -> str:
        """Why the node view cannot be trusted now ("" when it can): the stream's problem, or events it delivered
        that could not be handled for `max_failing` seconds (held and retried meanwhile)."""
        why, since = self.reflector.problem(max_failing), self.failing_since
        if why or since is None:
            return why
        failing = self.clock() - since
        if failing < max_failing:
            return ""
        return f"nodes: {len(self.failing)} node change(s) not handled for {failing:.0f}s ({self.last_error})"

    async def on_event(self, kind: str, node: dict[str, Any]) -> None:
        """Handle one event now, in the caller's turn (no coalescing: the stream's go through offer)."""
        async with self.lock:
            await self._on_event(kind, node)

    async def _on_event(self, kind: str, node: dict[str, Any]) -> None:
        WATCH_EVENTS.labels("node", kind).inc()
        name = str((node.get("metadata") or {}).get("name"))
        inv = None if kind == "DELETED" else node_inventory(node, self.cfg)
        before = self.last.get(name)
        raised = False
        if inv is None:
            self.knobs.forget(name)
        else:
            _, raised = await self.knobs.observe(node, inv, lambda: self.holders(name))
        self.mismatch.observe(name, node, inv)
        await self.apply(name, inv)
        # a card takes more slices now, or the node offers room it did not (new, open again, a card healthy or
        # uncordoned, more cards): kube-scheduler retries once the ledger says so. It retried at the Node's own
        # event too, perhaps before an extender's mirror had our write: a pod turned away then ("node
        # unregistered") waited for an unrelated event, up to its 5-minute flush
        if raised or offers_more(before, inv):
            self.nudge(name)

    async def on_sync(self, nodes: list[dict[str, Any]]) -> None:
        async with self.lock:
            # the list is newer than every event queued (the stream's, all received before it): none may be
            # handled after it, over its newer view. Dropped before the list is applied: if that fails, the
            # reflector lists again
            self.events.clear()
            self._held.clear()
            # the stream resumes from this list: what it wrote is the view now (however old a rebuild's was)
            self.written_rv = ""
            # a change that failed is in the list's view: written by it, or failing again (`_listed`)
            self.failing, self.last_error, self.stuck = {}, "", {}
            try:
                await self._on_sync(nodes)
            finally:
                NODES_UNWRITTEN.set(len(self.stuck))

    async def _listed(self, name: str, inv: Inventory | None, event: NodeEvent, was: Inventory | None) -> None:
        """A list's write of one node. One that fails for a reason no retry cures soon is closed and queued, its change
        tried again with backoff (`_stuck`), and the list goes on with the other nodes: raised, the whole list failed
        at that node, and was made again and again, no node after it written."""
        try:
            await self.apply(name, inv)
        except Exception as e:
            if is_transient(e):
                raise
            await self._stuck(name, e, was, str((event[1].get("metadata") or {}).get("uid") or ""))
            self.events.offer(name, event, self.clock(), deleted=event[0] == "DELETED",
                              not_before=self._retry_at(name))
            self._offered.set()

    async def _on_sync(self, nodes: list[dict[str, Any]]) -> None:
        invs = {inv.node: inv for inv in (node_inventory(n, self.cfg) for n in nodes)}
        # (after a re-list that failed, `last` holds only the nodes it wrote: every other node would look new)
        before = self.last if self.unlisted is None else self.unlisted
        self.unlisted = before
        self.knobs.keep_only(set(invs))  # nodes gone while the watch was down: no baseline kept for them
        raised: list[str] = []
        for n in nodes:  # a re-list may carry a change the lost stream did not deliver
            name = str((n.get("metadata") or {}).get("name"))
            _, up = await self.knobs.observe(n, invs[name], functools.partial(self.holders, name))
            if up:
                raised.append(name)
            self.mismatch.observe(name, n, invs.get(name))
        self.mismatch.synced(set(invs))
        self.last = {}  # force a write: the ledger may have been flushed or edited meanwhile
        self.kept = {}
        objs = {str((n.get("metadata") or {}).get("name")): n for n in nodes}
        for inv in invs.values():
            await self._listed(inv.node, inv, ("MODIFIED", objs[inv.node]), before.get(inv.node))
        for name in set(await self.ledger.nodes()) - {n for n, i in invs.items() if offers_cards(i)}:
            await self._listed(name, None, ("DELETED", objs.get(name) or {"metadata": {"name": name}}),
                               before.get(name))
        self.closed &= self.known  # (nodes gone from the ledger meanwhile: nothing of theirs to write again)
        if self.listed:  # (not at start: every node would be new to this watcher, and no filter saw it lag)
            raised += [name for name, inv in invs.items() if name not in raised and offers_more(before.get(name), inv)]
        self.listed = True
        self.unlisted = None
        for name in raised:  # as on_event: once the ledger has the higher limit or the room, kube-scheduler retries
            self.nudge(name)


def _listed_over(p: Pending[NodeEvent], list_rv: str, mark: int) -> bool:
    """Whether a node list (resourceVersion `list_rv`, requested when the queue had taken `mark` offers) is at least as
    new as the queued change `p`."""
    rv = str((p.value[1].get("metadata") or {}).get("resourceVersion") or "")
    return listed_over(rv, list_rv, p.offered <= mark)
