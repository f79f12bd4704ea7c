"""Watchers: stream nodes and pods into the ledger and release shares when pods end.

Several watcher replicas may run at once: every write is idempotent (upsert by node, observe and
release by pod uid, expiry by age), so duplicates converge to the same state. We chose this over
a Lease because a standby would be cold when the leader dies, and releases would stall for the
lease duration; the cost is duplicate Redis calls, which are cheap. The one transient effect: a
lagging replica may re-record a pod the other already released, until its own DELETED event
arrives a moment later.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from controller.knob_watch import KnobWatch
from controller.mismatch import MismatchReporter
from controller.reflector import Reflector
from shared.config import Config
from shared.domain.annotations import (
    ALLOCATED,
    GPU_INDEX,
    AnnotationError,
    PodUsage,
    record_cards,
    usage_from_annotations,
)
from shared.domain.node import Inventory, node_inventory, offers_more
from shared.domain.quota import is_terminal
from shared.domain.reconcile import (
    FUTURE_MS,
    Unrecorded,
    booking_key,
    expires,
    offers_cards,
    pending_since,
    quarantine_reason,
    recovered_usage,
    restamps,
)
from shared.domain.request import RequestError, pod_request
from shared.domain.timing import KEEP_MS
from shared.domain.trust import asks_slices, foreign_fate, foreign_record
from shared.domain.views import picked, spec_view
from shared.kube import Kube, KubeError
from shared.serving.metrics import (
    ANNOTATION_ERRORS,
    JANITOR_HELD,
    NUDGES,
    OVERCOMMIT,
    RECORD_MISMATCH,
    RECORDS,
    RELEASES,
    WATCH_EVENTS,
)
from shared.store.ledger import RESEND, Ledger, LedgerError, slot_moving
from shared.store.mirror import Mirror

log = logging.getLogger("mtsched.watchers")

# How long a bound pod's record waits for our bind's own confirmation (Extender._settle, a moment after the
# Binding) when the mirror shows its booking pending, before the watcher sends `observe` itself: at most a
# quarter of pendingTTLSeconds, so a bind that died before confirming is still confirmed long before expiry
BOUND_GRACE = 2.0
ENDED_SECONDS = 600.0  # how long a pod seen deleted or ended is remembered (PodWatcher.ended)


def pod_ref(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


MAX_GPU_INDEX_CHARS = 512  # what the view keeps of `gpu-index`; longer is no card list (recovered_usage: None)


def record_digest(raw: Any) -> bytes:
    """What the view keeps of an allocation record it has handled: 16 bytes, whatever the pod carries
    (an annotation can be 256 KiB); a changed record has another digest, so it is handled again."""
    return hashlib.blake2b(str(raw).encode(), digest_size=16).digest()


Holders = Callable[[str], dict[str, tuple[PodUsage, str]]]
# A keep window as long as the scripts allow (24 h): every booking is kept (see NodeWatcher.view_problem)
KEEP_ALL_MS = 86_400_000


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

    def __init__(self, kube: Kube, ledger: Ledger, cfg: Config, keep_ms: int = KEEP_MS):
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
        self.view_problem: Callable[[], str] = lambda: ""  # why `holders` cannot be trusted now ("" if it can)
        self.quarantine: Callable[[str], str] = lambda node: ""  # why the node must offer nothing, if so
        self.reflector = Reflector(kube, "/api/v1/nodes", self.on_event, self.on_sync, "nodes")
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

    def effective(self, inv: Inventory) -> Inventory:
        """The node as the ledger must hold it: closed (an error) while pods nobody can account for hold
        cards there."""
        why = "" if inv.error or not inv.cards else self.quarantine(inv.node)
        return replace(inv, error=why) if why else inv

    async def on_event(self, kind: str, node: dict[str, Any]) -> None:
        WATCH_EVENTS.labels("node", kind).inc()
        async with self.lock:
            await self._on_event(kind, node)

    async def _on_event(self, kind: str, node: dict[str, Any]) -> None:
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
            await self._on_sync(nodes)

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
        for inv in invs.values():
            await self.apply(inv.node, inv)
        for name in set(await self.ledger.nodes()) - {n for n, i in invs.items() if offers_cards(i)}:
            await self.apply(name, None)
        self.closed &= self.known  # (nodes gone from the ledger meanwhile: nothing of theirs to write again)
        if self.listed:  # (not at start: every node would be new to this watcher, and no filter saw it lag)
            raised += [name for name, inv in invs.items() if name not in raised and offers_more(before.get(name), inv)]
        self.listed = True
        self.unlisted = None
        for name in raised:  # as on_event: once the ledger has the higher limit or the room, kube-scheduler retries
            self.nudge(name)


FREED_ANNOTATION = "mtsched.io/capacity-freed"


class Nudger:
    """Tells kube-scheduler that a node gained card capacity, by touching a node annotation.

    kube-scheduler retries pods the extender rejected only on cluster events. When a pod is deleted
    it retries at once, usually before the watcher has released the pod's share, and the pod would
    then wait for an unrelated event (up to 5 minutes). The annotation change is such an event, sent
    `interval` after the release; a second one follows `follow_up` later, for a retry that still met a
    view without the release (an extender replica whose mirror was behind the feed, a retry already in
    flight), provided that view catches up within `follow_up`. Coalesced per node: at
    most one first patch per node per `interval`; a newer first patch supersedes an older pair's follow-up
    (it is later, and has one of its own), so at most one task per node waits for a follow-up and a burst
    of releases ends with one follow-up.

    `someone_waits` says whether a pod of our scheduler waits to be placed (the pod watcher's view), asked when a
    patch is due: with none, the patch wakes nobody and is not sent. Each is a Node write that every
    watcher of Nodes receives (kube-scheduler, node agents of CNIs and monitors on every node), so a
    steady cluster deleting pods no longer writes its Nodes for every deletion. A pod rejected just before
    a release and seen by the watch only later still gets the follow-up if the watch lags less than it.
    """

    def __init__(self, kube: Kube, interval: float = 0.5, follow_up: float = 5.0,
                 someone_waits: Callable[[], bool] = lambda: True):
        self.kube = kube
        self.interval = interval
        self.follow_up = follow_up
        self.someone_waits = someone_waits
        self._pending: set[str] = set()  # nodes whose first patch is still to be sent
        self._waiting: dict[str, asyncio.Event] = {}  # node -> set to drop the follow-up its task waits to send
        self._tasks: set[asyncio.Task[None]] = set()
        self.outcomes: dict[tuple[str, str], int] = {}  # (which, result) -> this nudger's patches, as NUDGES counts

    @property
    def sent(self) -> int:
        """Patches the API server took."""
        return sum(n for (_, result), n in self.outcomes.items() if result == "sent")

    def nudge(self, node: str) -> None:
        if node in self._pending:
            return
        self._pending.add(node)
        task = asyncio.create_task(self._send(node))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, node: str) -> None:
        await asyncio.sleep(self.interval)
        self._pending.discard(node)
        await self._patch(node, "first")
        if self.follow_up <= 0:
            return
        older = self._waiting.get(node)
        if older is not None:
            older.set()  # superseded: this first patch came later, and this task's follow-up is later too
        superseded = self._waiting[node] = asyncio.Event()
        try:
            await asyncio.wait_for(superseded.wait(), self.follow_up)
            return
        except TimeoutError:
            pass
        finally:
            if self._waiting.get(node) is superseded:
                del self._waiting[node]
        if node not in self._pending:  # else a newer nudge sends both of its own
            await self._patch(node, "follow_up")

    async def _patch(self, node: str, which: str) -> None:
        if not self.someone_waits():
            self._count(which, "idle")
            return
        body = {"metadata": {"annotations": {FREED_ANNOTATION: str(int(time.time() * 1000))}}}
        try:
            await self.kube.request("PATCH", f"/api/v1/nodes/{node}", body,
                                    content_type="application/merge-patch+json")
            self._count(which, "sent")
        except KubeError as e:
            if e.status == 404:  # the node went meanwhile: nothing to retry there
                self._count(which, "gone")
                return
            self._count(which, "error")
            # 403: the watcher's RBAC lacks `patch nodes`, and freed capacity is noticed only minutes later
            (log.warning if e.status in (401, 403) else log.debug)("could not nudge the scheduler about %s: %s",
                                                                   node, e)
        except Exception as e:
            self._count(which, "error")
            log.debug("could not nudge the scheduler about %s: %s", node, e)

    def _count(self, which: str, result: str) -> None:
        NUDGES.labels(which, result).inc()
        self.outcomes[which, result] = self.outcomes.get((which, result), 0) + 1


@dataclass(frozen=True)
class PodTruth:
    """What the API server says of one live pod that is bound or carries a record."""

    ref: str  # namespace/name
    node: str  # spec.nodeName
    usage: PodUsage | None  # what its record books; None without a (decodable) record
    opaque: bool = False  # carries a record we cannot decode: whatever the ledger holds for it is kept
    unrecorded: Unrecorded | None = None  # bound, asking for slices, no readable record


def unaccounted(pod: Mapping[str, Any], cfg: Config) -> Unrecorded | None:
    """A bound pod without a readable record that asks for slices (or whose request cannot be read, which
    counts as asking: fail closed); None if it asks for none."""
    if not asks_slices(pod, cfg):
        # names none of our resources: it holds no card, whatever else about it cannot be read. A red team closed
        # any GPU node to every slice pod with a CPU pod carrying a bad card pin (mtsched.io/card-memory), which
        # no admission sees on a CPU pod: its unreadable request counted as asking
        return None
    try:
        req = pod_request(pod, cfg)
    except RequestError:
        req = None
    else:
        if req is None:
            return None
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    gpu_index = str(ann.get(GPU_INDEX) or "")
    if len(gpu_index) > MAX_GPU_INDEX_CHARS:  # not kept (bounded view): unreadable, so the node stays closed
        gpu_index = "unreadable"
    elif gpu_index and ALLOCATED in ann:
        # gpu-index lists the last container's cards only. A record (foreign, or one the decoder refused) naming
        # other cards too means some container holds a card it does not name (HAMi v2.10 may put an init
        # container, a sidecar too, on another card): what the pod holds cannot be told, the node stays closed
        named = record_cards(ann[ALLOCATED])
        try:
            listed = {int(x) for x in gpu_index.split(",")}  # as recovered_usage reads it
        except ValueError:
            listed = set()  # unreadable already: recovered_usage tells nothing from it
        if named is not None and not named <= listed:
            gpu_index = "unreadable"
    return Unrecorded(pod_ref(pod), str((pod.get("spec") or {}).get("nodeName") or ""), req, gpu_index)


class PodWatcher:
    def __init__(self, kube: Kube, ledger: Ledger, mirror: Mirror, cfg: Config, lost: asyncio.Event):
        self.lost = lost
        self.kube = kube
        # uids of live pods of our scheduler not bound yet: whether a nudge can wake anyone (someone_waits).
        # While the stream is not listed yet or failing, the view cannot say nobody waits: the patch goes.
        self.waiting: set[str] = set()
        # of those, the ones no scheduler has tried yet (no PodScheduled condition): uid -> when first seen so
        # (monotonic). One that stays untried for minutes means no kube-scheduler of our profile works: its
        # container down, no leader, a profile of another name (mtsched_pods_untried_oldest_seconds)
        self.untried: dict[str, float] = {}
        self.nudger = Nudger(kube, someone_waits=lambda: bool(self.waiting) or bool(self.reflector.problem(0)))
        self.ledger = ledger
        self.mirror = mirror
        self.cfg = cfg
        # Per live pod the view keeps a few hundred bytes, never the pod (tests/unit/test_bounded_memory.py):
        self.seen: dict[str, bytes] = {}  # uid -> digest of the allocation annotation already handled
        self.truth: dict[str, PodTruth] = {}  # uid -> live pod that is bound or carries a record
        self.unrecorded: dict[str, Unrecorded] = {}  # the few of them without a readable record
        # node -> uids of `truth` naming it (nodeName or record), made on first use and kept up to date (None: to
        # be made): holders() of a node reads its own pods, not the whole view (a re-list of Nodes asked it of
        # every node: O(nodes x pods) on the event loop; a CPU node's status update, O(pods): red team)
        self._by_node: dict[str, dict[str, None]] | None = None
        # unrecorded by node, made again after any change of it (None): quarantine() is asked per node,
        # for every node of a pass, and a scan of every unrecorded pod per node was O(nodes x pods)
        self._lost_by_node: dict[str, list[Unrecorded]] | None = None
        self.ended: dict[str, float] = {}  # uid -> when the watch saw it deleted or ended (ENDED_SECONDS)
        # uid -> (when, record digest, its first 300 characters) of bound pods whose booking the mirror shows
        # pending as the record says: `observe` is sent then unless our bind has confirmed it (`confirm_due`).
        # Holds the pods between a Binding and its confirmation (a burst's rate x bound_grace), never a pod.
        self.deferred: dict[str, tuple[float, bytes, str]] = {}
        self.bound_grace = min(BOUND_GRACE, cfg.pending_ttl_seconds / 4)  # 0: observe at once (tests)
        self.confirming: set[str] = set()  # deferred records whose observe is in flight (confirm_due)
        # uid -> (node, why, pod ref): releases of ended pods on a node whose Redis Cluster slot is moving
        # (Mirror.moving: Redis runs no script there until the move ends), given back by confirm_due once the
        # mirror can read the node again. Held here so that the pod stream goes on: the event's replay would
        # hold every later pod event of every node for as long as the move lasts (a red team's finding)
        self.parked: dict[str, tuple[str, str, str]] = {}
        # (Redis's clock in ms, time.monotonic()) at the janitor's last read: a booking's age in `record` is
        # counted from it on the monotonic clock, which a step of this host's wall clock does not move
        self.redis_clock: tuple[int, float] | None = None
        self.pending_ttl_ms = cfg.pending_ttl_seconds * 1000
        self.reflector = Reflector(kube, "/api/v1/pods", self.on_event, self.on_sync, "pods", shape=watched_pod)
        self.inventories: Callable[[], Mapping[str, Inventory]] = dict  # the node watcher's view, set by the role
        # a quarantine may start or end on that node (the reconciler compares it soon)
        self.unaccounted_changed: Callable[[str], None] = lambda node: None

    def holders(self, node: str) -> dict[str, tuple[PodUsage, str]]:
        """Live pods that hold cards on `node`, as this watcher's view of the API says: from their records,
        or (record gone) from what survives on the pod (shared.domain.reconcile.recovered_usage)."""
        return self.holders_by_node({node}).get(node, {})

    def holders_by_node(self, only: set[str] | None = None) -> dict[str, dict[str, tuple[PodUsage, str]]]:
        """holders() of every node (or of `only`), in one pass over the view."""
        out: dict[str, dict[str, tuple[PodUsage, str]]] = {}
        invs = self.inventories()
        view: Iterable[tuple[str, PodTruth]] = self.truth.items()
        if only is not None:
            index = self._index()
            view = [(uid, self.truth[uid]) for node in only for uid in index.get(node, ())]
        for uid, t in view:
            usage = t.usage
            if usage is None and t.unrecorded is not None:
                usage = recovered_usage(t.unrecorded, invs.get(t.node))
            if usage is not None and (only is None or usage.node in only):
                out.setdefault(usage.node, {})[uid] = (usage, t.ref)
        return out

    def _index(self) -> dict[str, dict[str, None]]:
        if self._by_node is None:
            self._by_node = {}
            for uid, t in self.truth.items():
                self._indexed(uid, None, t)
        return self._by_node

    def _indexed(self, uid: str, old: PodTruth | None, new: PodTruth | None) -> None:
        """`uid`'s entry in `truth` goes from `old` to `new` (None: none): the index follows, if made."""
        index = self._by_node
        if index is None or old == new:
            return
        for t, add in ((old, False), (new, True)):
            if t is None:
                continue
            for node in {t.node, t.usage.node if t.usage is not None else t.node}:
                if add:
                    index.setdefault(node, {})[uid] = None
                elif (uids := index.get(node)) is not None:
                    uids.pop(uid, None)
                    if not uids:
                        del index[node]

    def quarantine(self, node: str) -> str:
        """Why `node` must offer no card: pods hold cards there that nobody can account for."""
        if self._lost_by_node is None:
            by_node: dict[str, list[Unrecorded]] = {}
            for u in self.unrecorded.values():
                by_node.setdefault(u.node, []).append(u)
            self._lost_by_node = by_node
        lost = self._lost_by_node.get(node, [])
        if not lost:
            return ""
        inv = self.inventories().get(node)
        return quarantine_reason(u for u in lost if recovered_usage(u, inv) is None)

    def waits(self, pod: Mapping[str, Any]) -> bool:
        """A live pod of our scheduler not bound yet: one a nudge may wake (it counts in `waiting`). A gated
        one (spec.schedulingGates) is not tried until its gates go, an update that tries it by itself."""
        spec = pod.get("spec") or {}
        return not spec.get("nodeName") and spec.get("schedulerName") == self.cfg.scheduler_name \
            and not spec.get("schedulingGates") and not (pod.get("metadata") or {}).get("deletionTimestamp")

    def learn(self, uid: str, pod: dict[str, Any]) -> PodTruth | None:
        """Update the view of one live pod; returns what it says (None: neither bound nor recorded)."""
        spec = pod.get("spec") or {}
        node = str(spec.get("nodeName") or "")
        if self.waits(pod):
            self.waiting.add(uid)
            if tried(pod):
                self.untried.pop(uid, None)
            else:
                self.untried.setdefault(uid, time.monotonic())
        else:
            self.waiting.discard(uid)
            self.untried.pop(uid, None)
        raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(ALLOCATED)
        if not node and raw is None:
            self._indexed(uid, self.truth.pop(uid, None), None)
            if self.unrecorded.pop(uid, None) is not None:
                self._lost_by_node = None
            return None
        usage, opaque = None, False
        # a record our bind cannot have written is no record at all (shared/domain/trust.py); record() says so
        if raw is not None and node and not foreign_record(pod, self.cfg):
            try:
                usage = usage_from_annotations(pod)
            except AnnotationError:
                opaque = True
        unrecorded = None
        if node and usage is None:
            unrecorded = unaccounted(pod, self.cfg)
        truth = PodTruth(pod_ref(pod), node, usage, opaque, unrecorded)
        self._indexed(uid, self.truth.get(uid), truth)
        self.truth[uid] = truth
        if (uid in self.unrecorded) != (unrecorded is not None):
            self.unaccounted_changed(node)
        if unrecorded is not None:
            self.unrecorded[uid] = unrecorded
            self._lost_by_node = None
        elif self.unrecorded.pop(uid, None) is not None:
            self._lost_by_node = None
        return truth

    def untried_for(self) -> float:
        """Seconds the oldest waiting pod has gone untried by any scheduler (0: none, or the pod view is not live:
        an attempt it missed would blame kube-scheduler for the watch's fault)."""
        if not self.untried or self.reflector.problem(0):
            return 0.0
        return time.monotonic() - min(self.untried.values())

    async def release(self, uid: str, pod: dict[str, Any], why: str) -> None:
        self.waiting.discard(uid)
        self.untried.pop(uid, None)
        self.seen.pop(uid, None)
        self._indexed(uid, self.truth.pop(uid, None), None)
        self.deferred.pop(uid, None)
        bound_to = (pod.get("spec") or {}).get("nodeName")
        hint = bound_to if isinstance(bound_to, str) else None
        if self.unrecorded.pop(uid, None) is not None:
            self._lost_by_node = None
            self.unaccounted_changed(hint or "")
        now = time.monotonic()
        self.ended.pop(uid, None)
        self.ended[uid] = now  # (at the end: the dict stays in the order of its times)
        # the entries older than 10 minutes are at its front: dropped from there, a few per release (rebuilding
        # the whole dict past 50,000 entries cost every release 6.8 ms while a burst of them lasted: red team)
        for old in list(itertools.islice(self.ended, 64)):
            if now - self.ended[old] < ENDED_SECONDS:
                break
            del self.ended[old]
        node = self.mirror.owner_of(uid, hint) or bound_to
        if node:
            await self._release(uid, str(node), why, pod_ref(pod))

    async def _release(self, uid: str, node: str, why: str, ref: str) -> None:
        """Give the pod's booking back, or park it while the node's slot moves (`parked`)."""
        if node in self.mirror.moving:
            self.parked[uid] = (node, why, ref)
            return
        try:
            released = await self.ledger.release(node, uid, give_up=slot_moving)  # (redis-py retried a move)
        except RESEND as e:  # (as Ledger._retry raised it; the ledger told the mirror)
            if not slot_moving(e):
                raise
            log.warning("release of %s (%s) on %s waits for the end of its Redis Cluster slot's move", ref, uid, node)
            self.parked[uid] = (node, why, ref)
            return
        self.parked.pop(uid, None)
        if released:
            RELEASES.labels(why).inc()
            self.nudger.nudge(node)
            log.info("released %s (%s) on %s: %s", ref, uid, node, why)

    async def record(self, uid: str, pod: dict[str, Any], truth: PodTruth | None = None) -> None:
        """Book what a bound pod's record says (`observe`), unless the ledger holds it already. `truth`: what
        `learn` made of this very pod, so its record is not decoded a second time."""
        raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(ALLOCATED)
        if raw is None or not (pod.get("spec") or {}).get("nodeName"):
            return
        digest = record_digest(raw)
        if self.seen.get(uid) == digest:
            return
        usage = truth.usage if truth is not None else None  # decoded, and not foreign (learn checks both)
        if usage is None:
            foreign = foreign_record(pod, self.cfg)
            if foreign:
                RECORD_MISMATCH.labels("foreign").inc()
                log.error("pod %s carries an allocation record although %s: our bind never wrote it, %s (record %r)",
                          pod_ref(pod), foreign, foreign_fate(unaccounted(pod, self.cfg) is not None), str(raw)[:300])
                self.seen[uid] = digest
                return
            try:
                usage = usage_from_annotations(pod)
            except AnnotationError as e:
                # Fail closed: keep whatever the ledger holds for this pod rather than freeing capacity.
                ANNOTATION_ERRORS.inc()
                log.error("pod %s has an undecodable allocation record, its usage is kept: %s", pod_ref(pod),
                          str(e)[:500])  # the error quotes the record, which can be 256 KiB
                self.seen[uid] = digest
                return
            if usage is None:
                return
        held = self._held(uid, usage)
        if held == "bound":
            self._skip(uid, digest)
            return
        if held == "pending" and self.bound_grace > 0 and not self._late(uid, usage):
            # our bind's booking of this very record, which the bind confirms a moment after its Binding: wait
            # for that instead of a second round trip (confirm_due sends observe if it does not come). The
            # pod's next events (status updates follow a Binding closely) keep the due the record first got:
            # pushed later each time, a binder that died would leave the booking pending until it expired
            prev = self.deferred.get(uid)
            due = prev[0] if prev is not None and prev[1] == digest else time.monotonic() + self.bound_grace
            self.deferred[uid] = (due, digest, str(raw)[:300])
            return
        self.deferred.pop(uid, None)
        booked = usage.node not in self.mirror.moving and await self._observe(uid, usage, pod_ref(pod), digest,
                                                                               str(raw)[:300])
        if not booked and usage.node in self.mirror.moving:
            # no script runs there until its slot's move ends (a failed observe told the mirror): held back, so
            # that the pod stream goes on, and sent by confirm_due once the node can be read
            self.deferred[uid] = (time.monotonic() + max(self.bound_grace, 0.05), digest, str(raw)[:300])

    def _held(self, uid: str, usage: PodUsage) -> str:
        """The state of the mirror's booking of `uid` if it is the one `usage` says, else "". The mirror
        trails the ledger by a feed message at most, and a booking that is bound stays so until released
        (the pod ended) or a repair changes it, which the reconciler compares against this view again."""
        snap = self.mirror.get(usage.node)
        r = snap.reservations.get(uid) if snap is not None else None
        if r is None or (r.cards, r.mem, r.cores, r.slices) != (usage.cards, usage.memory, usage.cores, usage.slices):
            return ""
        return r.state

    def _late(self, uid: str, usage: PodUsage) -> bool:
        """The mirror's booking of `uid` is past half its TTL: its record is sent at once, not held back. A record
        seen that late (a watch that lagged) would wait its grace close to the TTL, where any replica's janitor
        (which cannot know this replica holds it back) may expire the booking under the running pod."""
        snap = self.mirror.get(usage.node)
        r = snap.reservations.get(uid) if snap is not None else None
        if r is None:
            return True
        age = self.redis_now_ms() - r.created
        return age > self.pending_ttl_ms / 2 or age < -FUTURE_MS

    def redis_now_ms(self) -> float:
        """Redis's clock now, as this host estimates it: its last reading plus the monotonic time since (a step
        of this host's wall clock between two sweeps moved a wall-clock estimate by the step: red team, clocks).
        Before the janitor's first reading: this host's wall clock."""
        if self.redis_clock is None:
            return time.time() * 1000
        redis_ms, at = self.redis_clock
        return redis_ms + (time.monotonic() - at) * 1000

    def saw_redis_time(self, redis_ms: int) -> None:
        """The janitor read Redis's clock: what it said, and when on the monotonic clock."""
        self.redis_clock = (redis_ms, time.monotonic())

    def _skip(self, uid: str, digest: bytes) -> None:
        self.deferred.pop(uid, None)
        self.seen[uid] = digest
        RECORDS.labels("already_bound").inc()

    async def confirm_due(self, now: float | None = None) -> int:
        """Deferred records whose time has come: confirmed by our bind meanwhile (the mirror shows the booking
        bound), or sent to `observe` now. Returns how many were sent."""
        now = time.monotonic() if now is None else now
        sent = 0
        for uid, (node, why, ref) in list(self.parked.items()):
            if node not in self.mirror.moving and self.parked.get(uid) == (node, why, ref):
                del self.parked[uid]  # (taken: confirm_due runs in two tasks; _release parks it again if refused)
                try:
                    await self._release(uid, node, why, ref)
                except BaseException:
                    self.parked.setdefault(uid, (node, why, ref))
                    raise
        for uid in [u for u, (due, _, _) in self.deferred.items() if due <= now]:
            entry = self.deferred.pop(uid, None)
            truth = self.truth.get(uid)
            if entry is None or truth is None or truth.usage is None:
                continue  # released meanwhile, or a newer event said otherwise (and was handled then)
            _, digest, head = entry
            if self.seen.get(uid) == digest:
                continue
            if truth.usage.node in self.mirror.moving:  # no script runs there: again once the mirror reads it
                self.deferred[uid] = (time.monotonic() + max(self.bound_grace, 0.05), digest, head)
                continue
            if self._held(uid, truth.usage) == "bound":
                self._skip(uid, digest)
                continue
            self.confirming.add(uid)
            try:
                booked = await self._observe(uid, truth.usage, truth.ref, digest, head)
            except BaseException:
                # not booked (Redis gone past the ledger's retries): due again when the supervisor runs this
                # loop again, as a failed event is replayed; judged afresh then (released, or handled by a
                # newer event meanwhile: dropped, or that one's entry kept)
                self.deferred.setdefault(uid, entry)
                raise
            finally:
                self.confirming.discard(uid)
            if not booked:
                # a script error (or the node missing: a rebuild comes): tried again a grace later, and the
                # janitor keeps its booking meanwhile (confirm_now)
                self.deferred.setdefault(uid, (time.monotonic() + max(self.bound_grace, 0.05), digest, head))
            sent += 1
        return sent

    async def confirm_now(self, uids: Iterable[str]) -> set[str]:
        """The records of these pods that wait for our bind's confirmation, sent now whatever their due: the
        janitor is about to expire their pending bookings. A record first seen late in its booking's TTL (a
        watch that lagged) would otherwise wait its grace past the TTL, and a binder that died before
        confirming would have the running pod's share freed. Returns those of `uids` the janitor must keep:
        held back still (a record that arrived meanwhile, one whose observe failed), or being sent by the loop."""
        asked = set(uids)
        for uid in asked:
            entry = self.deferred.get(uid)
            if entry is not None:
                self.deferred[uid] = (0.0, entry[1], entry[2])
        await self.confirm_due()
        # judged after the last await: the janitor calls expire with no await between
        return {u for u in asked if u in self.deferred or u in self.confirming}

    async def confirm_deferred(self) -> None:
        """confirm_due, every half grace (for a supervisor to run)."""
        while True:
            await asyncio.sleep(max(self.bound_grace / 2, 0.05))
            await self.confirm_due()

    async def _observe(self, uid: str, usage: PodUsage, ref: str, digest: bytes, head: str) -> bool:
        """`observe` with keep_bound, and what its answer means; `head`: the record's start, for the logs.
        False: not booked (a script error, or the node missing)."""
        RECORDS.labels("observed").inc()
        try:
            # keep_bound: once our bind's booking is bound, a record that says otherwise is not booked
            out = await self.ledger.observe(uid, usage, ref, keep_bound=True, give_up=slot_moving)
        except LedgerError as e:
            log.error("cannot record %s: %s", ref, e)
            return False
        except RESEND as e:  # (as Ledger._retry raised it)
            if not slot_moving(e):
                raise
            # the ledger told the mirror: the caller holds the record back until the node can be read
            log.warning("cannot record %s yet: its node's Redis Cluster slot is moving", ref)
            return False
        if not out.get("ok"):
            log.error("cannot record %s on %s: %s; rebuilding", ref, usage.node, out.get("reason"))
            self.lost.set()
            return False
        if out.get("kept"):
            RECORD_MISMATCH.labels("changed").inc()
            log.error("pod %s: its allocation record changed after our bind: it says cards %s (%d units, %d cores, "
                      "%d slices) on %s; the ledger keeps what the bind booked: %s (record %r)", ref,
                      list(usage.cards), usage.memory, usage.cores, usage.slices, usage.node, out.get("booked"),
                      head)
            self.seen[uid] = digest
            return True
        if out.get("overcommit"):
            OVERCOMMIT.inc()
            log.error("pod %s over-commits card(s) %s on %s (recorded as the API server says)", ref,
                      usage.cards, usage.node)
        self.seen[uid] = digest
        return True

    async def on_event(self, kind: str, pod: dict[str, Any]) -> None:
        WATCH_EVENTS.labels("pod", kind).inc()
        uid = str((pod.get("metadata") or {}).get("uid"))
        if kind == "DELETED":
            await self.release(uid, pod, "deleted")
        elif is_terminal(pod):
            await self.release(uid, pod, (pod.get("status") or {}).get("phase", "ended").lower())
        else:
            await self.record(uid, pod, self.learn(uid, pod))

    async def on_sync(self, pods: list[dict[str, Any]]) -> None:
        """After a (re-)list: the view is replaced whole; bound pods are recorded and ended ones released.
        Reservations of pods that vanished unseen are the reconciler's (woken by the reflector)."""
        self.seen = {}
        self.truth = {}
        self._by_node = None
        self.unrecorded = {}
        # `deferred` is kept: each listed pod is judged again below (a record keeps its due), and an entry of
        # a pod the list lacks finds no truth when due and is dropped
        # whole before the first await below (each pod may take a Redis round trip): a nudge due meanwhile
        # sees the pods the list holds waiting, not a view emptied for the re-list
        self.waiting = {str((p.get("metadata") or {}).get("uid")) for p in pods if not is_terminal(p) and self.waits(p)}
        self.untried = {uid: since for uid, since in self.untried.items() if uid in self.waiting}  # learn() adds
        self._lost_by_node = None
        # the view learnt whole before the first await too: a due record (confirm_due, or the janitor's
        # confirm_now) judged meanwhile finds its pod's truth, not an entry dropped as if the pod were gone
        truths = {str((p.get("metadata") or {}).get("uid")): self.learn(str((p.get("metadata") or {}).get("uid")), p)
                  for p in pods if not is_terminal(p)}
        for pod in pods:
            uid = str((pod.get("metadata") or {}).get("uid"))
            if is_terminal(pod):
                await self.release(uid, pod, "ended")
                continue
            await self.record(uid, pod, truths.get(uid))


# What the watchers read of a pod (the pod watcher, the reconciler's lists, the rules they call: records, trust,
# unaccounted pods, lifecycle). A re-list holds every pod until it is handled: whole pods (~16 KiB decoded, far
# more with large annotations or env) made a list of 50,000 pods cost the watcher 827 MiB (red team).
POD_META = ("name", "namespace", "uid", "resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds")
POD_SPEC = ("nodeName", "schedulerName", "schedulingGates", "priority", "priorityClassName", "resources")
POD_CONTAINER = ("name", "resources", "restartPolicy")
POD_STATUS = ("phase", "nominatedNodeName")
# annotations of these prefixes only: HAMi's and the vendor's (records, pins, policies) and ours
POD_ANNOTATION_PREFIXES = ("hami.io/", "mthreads.ai/", "mthreads.com/", "mtsched.io/")


def watched_pod(pod: Any) -> Any:
    """The part of a pod the watchers read (Reflector's shape for pods); anything but a dict as it is."""
    if not isinstance(pod, dict):
        return pod

    meta, status = pod.get("metadata"), pod.get("status")
    view_meta = picked(meta, POD_META)
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    if isinstance(annotations, dict):
        view_meta["annotations"] = {k: v for k, v in annotations.items()
                                    if isinstance(k, str) and k.startswith(POD_ANNOTATION_PREFIXES)}
    elif annotations is not None:
        view_meta["annotations"] = annotations  # malformed: the rules that read it say so
    view_spec = spec_view(pod.get("spec"), POD_SPEC, POD_CONTAINER)
    view_status = picked(status, POD_STATUS)
    conditions = status.get("conditions") if isinstance(status, dict) else None
    if isinstance(conditions, list):  # tried(): kube-scheduler's PodScheduled condition
        view_status["conditions"] = [{k: c[k] for k in ("type", "reason") if k in c} for c in conditions
                                     if isinstance(c, dict) and c.get("type") == "PodScheduled"]
    return {"metadata": view_meta, "spec": view_spec, "status": view_status}


def tried(pod: Mapping[str, Any]) -> bool:
    """Whether a scheduler has tried the pod: kube-scheduler sets its PodScheduled condition on every attempt
    that does not bind it (Unschedulable, SchedulerError), and binds the others. `SchedulingGated` is set on a
    pod with scheduling gates, which no scheduler tries, and stays after its gates are gone until one does."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(isinstance(c, Mapping) and c.get("type") == "PodScheduled" and c.get("reason") != "SchedulingGated"
               for c in conditions)


def wire(nodes: NodeWatcher, pods: PodWatcher) -> None:
    """Connect one role's two watchers: each reads the other's view of the API."""
    nodes.holders = pods.holders
    nodes.quarantine = pods.quarantine
    nodes.nudge = pods.nudger.nudge
    nodes.view_problem = lambda: pods.reflector.problem(0)
    pods.inventories = lambda: nodes.last


# How long the pod stream must have worked, after its list or a resume, before the janitor expires anything:
# a resumed watch replays the events it missed, a bound pod's record among them
JANITOR_VIEW_SETTLE_SECONDS = 10.0


def janitor_for(ledger: Ledger, mirror: Mirror, cfg: Config, pods: PodWatcher) -> Janitor:
    """The watcher role's janitor, wired to its pod watcher: the records it holds back are booked, never
    expired (before_expire), none is expired while its pod view is blind (view_problem), and it learns Redis's
    clock from each sweep (redis_time), for `_late`."""
    return Janitor(ledger, mirror, cfg, nudger=pods.nudger, before_expire=pods.confirm_now,
                   redis_time=pods.saw_redis_time,
                   view_problem=lambda: pods.reflector.unsettled(JANITOR_VIEW_SETTLE_SECONDS))


class Janitor:
    """Reclaims pending reservations whose binder died or gave up, after the TTL."""

    def __init__(self, ledger: Ledger, mirror: Mirror, cfg: Config, interval: float = 5.0,
                 nudger: Nudger | None = None,
                 before_expire: Callable[[list[str]], Awaitable[Collection[str]]] | None = None,
                 redis_time: Callable[[int], None] | None = None,
                 view_problem: Callable[[], str] | None = None):
        self.nudger = nudger
        self.ledger = ledger
        self.mirror = mirror
        self.ttl = cfg.pending_ttl_seconds
        self.interval = interval
        # called with the uids of pending bookings past the TTL before they are expired: the pod watcher
        # confirms those whose record it holds back (PodWatcher.confirm_now), so a record seen late is booked;
        # it returns those it could not (held back, in flight, failed): they are not expired
        self.before_expire = before_expire
        self.redis_time = redis_time  # told Redis's clock each sweep (PodWatcher.saw_redis_time)
        # why the pod view cannot vouch for a pending booking now ("" when it can): a booking stays pending
        # after its Binding when the binder died, its confirmation failed or the Binding's outcome was
        # unknown, and only the pod watcher's sight of the record saves it. While that view is blind (the
        # stream down, or just back and replaying), expiring it could free a running pod's cards.
        self.view_problem = view_problem or (lambda: "")
        self._held = ""  # the problem that holds expiry back, logged once per episode
        # pending booking (booking_key) -> first seen, monotonic (pending_since)
        self._since: dict[tuple[str, str, int, int], float] | None = None

    async def sweep(self) -> list[str]:
        # Reservations are stamped with Redis's clock, so age is measured on it: this host's may be off.
        now = await self.ledger.redis_time_ms()
        if self.redis_time is not None:
            self.redis_time(now)
        gone: list[str] = []
        clock = time.monotonic()
        ages = {booking_key(node, r): now - r.created for node, snap in self.mirror.nodes.items()
                for r in snap.reservations.values() if r.state == "pending"}
        since = pending_since(ages, self._since or {}, clock, first=self._since is None)
        # and the dates of stamps only a fresh read showed (below), while their booking is pending in the mirror
        live = {k[:2] for k in ages}
        since.update((k, at) for k, at in (self._since or {}).items() if k not in since and k[:2] in live)
        if self.mirror.nodes:  # (a mirror not read yet, at the start, dates nothing: its whole read comes at once)
            self._since = since
        for node, snap in list(self.mirror.nodes.items()):
            if node in self.mirror.moving:  # Redis runs no script there until its slot's move ends: next sweep
                continue
            # past the TTL on Redis's clock and on ours (pending_since); and those stamped ahead of Redis's clock,
            # which expire.lua stamps anew (restamps)
            due = [r.uid for r in snap.reservations.values()
                   if expires(r, now, self.ttl * 1000) and clock - since[booking_key(node, r)] >= self.ttl]
            if due:
                # A later bind attempt that takes over the booking (reserve's `existing`) stamps a new settle_by
                # and sends no feed message: the mirror's copy still bears the first attempt's, dated long ago.
                # Asked of Redis itself, a stamp not dated yet is dated now (a step of Redis's clock forward would
                # otherwise free the card that attempt's Binding is about to take)
                try:
                    fresh = await self.ledger.snapshot(node, give_up=slot_moving)
                except RESEND as e:  # (as Ledger._retry raised it)
                    if not slot_moving(e):
                        raise
                    continue  # its slot is moving: the other nodes are swept
                held = fresh.reservations if fresh is not None else {}
                for uid in due:
                    if uid in held:
                        since.setdefault(booking_key(node, held[uid]), clock)
                due = [u for u in due if u in held and clock - since[booking_key(node, held[u])] >= self.ttl]
            old = due + [r.uid for r in snap.reservations.values() if restamps(r, now) and r.uid not in due]
            if old:
                if self.before_expire is not None:
                    keep = await self.before_expire(old)
                    old = [u for u in old if u not in keep]  # no await from here to expire's send
                if self._blind(len(old)):  # judged after the last await, as before_expire's answer
                    continue
                # only the uids vetted here: expire.lua judges at its own `now`, and a booking that crossed the
                # TTL since ours (or one the mirror lags on) was never offered to before_expire
                try:
                    expired = await self.ledger.expire(node, self.ttl, only=old)
                except RESEND as e:  # (as Ledger._retry raised it)
                    if not slot_moving(e):
                        raise
                    continue  # its slot is moving (the ledger told the mirror): the other nodes are swept

                RELEASES.labels("expired").inc(len(expired))
                if expired and self.nudger:
                    self.nudger.nudge(node)
                gone.extend(expired)
        if gone:
            log.info("expired %d pending reservation(s) older than %ss", len(gone), self.ttl)
        self._blind(0)  # a sweep with nothing to expire still ends an episode (or starts one: the gauge)
        return gone

    def _blind(self, due: int) -> bool:
        """True while the pod view is blind: nothing is expired. The gauge and one log line per episode."""
        why = self.view_problem()
        JANITOR_HELD.set(1 if why else 0)
        if why and not self._held:
            log.warning("janitor: expiring no pending reservation while the pod view is blind (%s)%s", why,
                        f": {due} past pendingTTLSeconds kept" if due else "")
        elif self._held and not why:
            log.info("janitor: the pod view is live again: expiring pending reservations past the TTL")
        self._held = why
        return bool(why)

    async def run(self) -> None:
        while True:  # errors go to the supervisor, which restarts the loop with backoff
            await self.sweep()
            await asyncio.sleep(self.interval)
