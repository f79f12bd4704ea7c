"""The pod watcher: books what bound pods' records say, releases what ended pods held, and what it reads of a pod."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from controller.nudger import Nudger
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
from shared.domain.ended import ENDED_KEEP_MS
from shared.domain.janitor_reads import Answer, Verdict, after_read, answered, before_read, holds_reads, pod_name
from shared.domain.node import Inventory
from shared.domain.quota import is_terminal
from shared.domain.reconcile import FUTURE_MS, Unrecorded, quarantine_reason, recovered_usage
from shared.domain.request import RequestError, held_request
from shared.domain.timing import API_HOLDS_READ_S, API_HOLDS_READS
from shared.domain.trust import asks_slices, foreign_fate, foreign_record
from shared.domain.views import picked, spec_view
from shared.kube import Kube, KubeError
from shared.serving.metrics import (
    ANNOTATION_ERRORS,
    JANITOR_KEPT,
    OVERCOMMIT,
    RECORD_MISMATCH,
    RECORDS,
    RELEASES,
    WATCH_EVENTS,
)
from shared.store.ledger import RESEND, Ledger, LedgerError, slot_moving
from shared.store.mirror import Mirror

log = logging.getLogger("mtsched.watchers")


# How long a bound pod's record waits for our bind's own confirmation (controller/confirm.py Confirmations.settle, a
# moment after the Binding) when the mirror shows its booking pending, before the watcher sends `observe` itself: at
# most a quarter of pendingTTLSeconds, so a bind that died before confirming is still confirmed long before expiry
BOUND_GRACE = 2.0
# how long a pod seen deleted or ended is remembered (PodWatcher.ended): as long as its tombstone is kept
ENDED_SECONDS = ENDED_KEEP_MS / 1000
# The janitor's reads of pods before it expires their bookings (api_holds): API_HOLDS_READ_S each, at most
# API_HOLDS_READS at once over every node of a sweep (shared/domain/timing.py says why; the judging is
# shared/domain/janitor_reads.py)


def pod_ref(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


MAX_GPU_INDEX_CHARS = 512  # what the view keeps of `gpu-index`; longer is no card list (recovered_usage: None)


def record_digest(raw: Any) -> bytes:
    """What the view keeps of an allocation record it has handled: 16 bytes, whatever the pod carries
    (an annotation can be 256 KiB); a changed record has another digest, so it is handled again."""
    return hashlib.blake2b(str(raw).encode(), digest_size=16).digest()


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
        req = held_request(pod, cfg)  # not its pin: its owner may change it after the bind, it steers placement only
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
        self.nudger = Nudger(kube, someone_waits=lambda: bool(self.waiting) or bool(self.reflector.problem(0)),
                             cluster_wide=cfg.nudge_any_node)
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
        # after each round of confirm_deferred that completed (Supervisor.progress): its Redis round trips that
        # timed out during a freeze no longer keep the watcher unready once one works
        self.on_progress: Callable[[], None] = lambda: None
        # uid -> (node, why, pod ref): releases of ended pods on a node whose Redis Cluster slot is moving
        # (Mirror.moving: Redis runs no script there until the move ends), given back by confirm_due once the
        # mirror can read the node again. Held here so that the pod stream goes on: the event's replay would
        # hold every later pod event of every node for as long as the move lasts (a red team's finding)
        self.parked: dict[str, tuple[str, str, str]] = {}
        # (Redis's clock in ms, time.monotonic()) at the janitor's last read: a booking's age in `record` is
        # counted from it on the monotonic clock, which a step of this host's wall clock does not move
        self.redis_clock: tuple[int, float] | None = None
        # api_holds: no read of a pod until then (monotonic), a read having gone unanswered; and why the janitor
        # could not ask the API server last ("": it answered), so that an episode is logged once, not per booking
        self.api_unanswered_until = 0.0
        self.api_unasked = ""
        # api_holds' turns to read, shared by every node of a sweep (its nodes' reads overlap): API_HOLDS_READS
        self.api_reads = asyncio.Semaphore(API_HOLDS_READS)
        # why the janitor's view check says the view is blind ("": live), set by the role (janitor_for): a read whose
        # turn comes while it is blind is not made (nothing is expired then, whatever it says)
        self.reads_blind: Callable[[], str] = lambda: ""
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
        owner = self.mirror.owner_of(uid, hint)
        if hint:  # bound: its booking is on its node, whatever a mirror that missed feed messages lists
            await self._release(uid, hint, why, pod_ref(pod))
        if owner and owner != hint:
            # listed elsewhere: a booking of an earlier attempt (given back since, if the mirror is stale; else
            # one the janitor would expire), or the pod never bound. Not parked when its node is bound too
            await self._release(uid, owner, why, pod_ref(pod), park=not hint)

    async def _release(self, uid: str, node: str, why: str, ref: str, park: bool = True) -> None:
        """Give the pod's booking back, or park it while the node's slot moves (`parked`; not `park`: left to the
        janitor's expiry and the reconciler). Every release here is of a pod that ended (deleted, Succeeded or
        Failed): it tombstones the uid on the node (Ledger.release's `ended`, shared/domain/ended.py), so a write
        read before the pod ended (a held-back record's observe, a node written with its holders, a repair) books
        it there no more."""
        if node in self.mirror.moving:
            if park:
                self.parked[uid] = (node, why, ref)
            return
        try:
            # (redis-py retried a move)
            released = await self.ledger.release(node, uid, give_up=slot_moving, ended=True)
        except RESEND as e:  # (as Ledger._retry raised it; the ledger told the mirror)
            if not slot_moving(e):
                raise
            if park:
                log.warning("release of %s (%s) on %s waits for the end of its Redis Cluster slot's move", ref, uid,
                            node)
                self.parked[uid] = (node, why, ref)
            return
        if self.parked.get(uid, ("",))[0] == node:
            del self.parked[uid]
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
                if booked and uid in self.ended and uid not in self.truth:
                    # the pod ended while its observe was on its way (this runs beside the pod stream): its release
                    # reached Redis first, so its tombstone kept the observe from booking it (observe.lua `ended`).
                    # Given back again all the same, a belt: a release from a replica of an older release (a roll)
                    # leaves no tombstone, nor does one on a node Redis did not hold then, or a Redis that lost it
                    self.seen.pop(uid, None)  # (set by that observe, after the release dropped it)
                    await self._release(uid, truth.usage.node, "gone", truth.ref)
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

    async def api_holds(self, node: str, refs: Mapping[str, str]) -> set[str]:
        """Of the pending bookings on `node` the janitor is about to expire (uid -> its pod's namespace/name), those
        whose pod the API server holds bound there, or cannot say of (kept: fail closed). The view's silence vouches
        for nothing: a stream that works may still be behind (an API server's watch cache trailing etcd, a frozen
        replica's silent stream taken for a quiet one until WATCH_READ_S, this watcher's own backlog of events), and
        nothing measures by how much; a Binding committed in the TTL's first half, its binder dead before confirming,
        would have its running pod's share freed until the view caught up. So the pod is read from the API server
        (a GET reads etcd), as the reconciler does before it frees a booking (Reconciler._confirm). Kept, such a
        booking is booked when the view shows the pod's record (`_late`: sent at once), or expired by a later sweep
        once the API server says otherwise. Bookings reach the janitor only when their binder died or gave up:
        a read each, per sweep; the janitor asks about its nodes at once, and `api_reads` lets API_HOLDS_READS of
        their reads run at a time (shared/domain/timing.py). What is read and what each answer means:
        shared/domain/janitor_reads.py."""
        def first(uid: str, ref: str) -> Verdict:
            seen = self.truth.get(uid)
            return before_read(node, ref, seen.node if seen is not None else None,
                               time.monotonic() < self.api_unanswered_until)

        async def holds(uid: str, ref: str) -> bool:
            verdict, why = first(uid, ref), "a read just before went unanswered"
            if verdict == "read":
                async with self.api_reads:  # its turn: API_HOLDS_READS at once, over every node the janitor sweeps
                    if self.reads_blind():  # blind while it waited for its turn (red team): kept, unread, and the
                        return True  # janitor expires nothing on this node now (Janitor._expire)
                    verdict = first(uid, ref)  # judged again at its turn: the view, and a read unanswered meanwhile
                    if verdict == "read":
                        answer, why = await self._read_pod(ref)
                        if holds_reads(answer):
                            self.api_unanswered_until = time.monotonic() + API_HOLDS_READ_S
                        if answered(answer):
                            self._answered()
                        verdict = after_read(uid, node, answer)
            return self._kept(verdict, ref, node, why)

        asked = list(refs.items())
        kept = await asyncio.gather(*(holds(uid, ref) for uid, ref in asked))
        return {uid for (uid, _), keep in zip(asked, kept, strict=True) if keep}

    async def _read_pod(self, ref: str) -> tuple[Answer, str]:
        """The API server's answer to a GET of the pod `ref` within API_HOLDS_READ_S (janitor_reads.Answer), and
        what went wrong ("" when it answered with the pod)."""
        ns, name = pod_name(ref) or ("", "")
        try:
            async with asyncio.timeout(API_HOLDS_READ_S):
                return await self.kube.get_pod(ns, name), ""
        except KubeError as e:
            return e.status, str(e)
        except Exception as e:  # (a timeout, the connection lost: we cannot tell)
            return None, f"{type(e).__name__}: {e}"

    def _kept(self, verdict: Verdict, ref: str, node: str, why: str) -> bool:
        """Whether api_holds keeps the booking of `ref` on `node` (janitor_reads' verdict), counted and said so."""
        if verdict == "view_bound":
            # the view holds it bound there already: a record it can book is booked (record, confirm_now); one
            # it cannot (none, unreadable, foreign) keeps the booking for the pod's life, as the reconciler
            # keeps it (Reconciler._confirm), with no read of the API server every sweep (red team)
            log.debug("janitor: keeping the pending booking of %s on %s: the pod view has it bound there", ref, node)
            JANITOR_KEPT.labels("view_bound").inc()
            return True
        if verdict == "api_unanswered":
            return self._unasked(ref, node, why)
        if verdict == "api_bound":
            log.info("janitor: keeping the pending booking of %s on %s past pendingTTLSeconds: the API server "
                     "has the pod bound there, the pod view has not shown it yet", ref, node)
            JANITOR_KEPT.labels("api_bound").inc()
            return True
        return False  # no pod name recorded, gone, another pod of that name, ended, or not bound there

    def _unasked(self, ref: str, node: str, why: str) -> bool:
        """api_holds could not ask the API server about `ref`: its booking is kept (True). Said once per episode (a
        warning per booking per sweep flooded the log while the API server did not answer: red team)."""
        (log.debug if self.api_unasked else log.warning)(
            "janitor: cannot ask the API server about %s (%s): its pending booking on %s is kept, as every one it "
            "cannot ask about until it answers", ref, why, node)
        self.api_unasked = why
        JANITOR_KEPT.labels("api_unanswered").inc()
        return True

    def _answered(self) -> None:
        if self.api_unasked:
            log.info("janitor: the API server answers again: pending bookings past the TTL are expired once it says "
                     "their pod does not hold them")
        self.api_unasked = ""

    async def confirm_deferred(self) -> None:
        """confirm_due, every half grace (for a supervisor to run); `on_progress` after each that completed."""
        while True:
            await asyncio.sleep(max(self.bound_grace / 2, 0.05))
            await self.confirm_due()
            self.on_progress()

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
        if out.get("ended"):
            # tombstoned: the pod ended and its release came first (confirm_due's race with the pod stream)
            log.info("not recording %s on %s: its pod ended", ref, usage.node)
            self.seen[uid] = digest
            return True
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
