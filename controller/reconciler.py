"""Keeps the ledger equal to the API server's truth: full rebuilds when Redis lost its state, and
continuous anti-entropy for every other kind of drift.

* Every `check_seconds` (2 s): is the ledger intact (`mt:epoch` exists, no known node went missing)?
  If not, rebuild it whole from a fresh list of nodes and pods.
* A pod bound without a record appears or goes: only its node is compared, soon (`touch`): a burst of such
  pods (they bypass the webhook) must not make every pass read every node of a large fleet.
* Every `reconcileSeconds` (and soon after a watch re-list or a Redis reconnect): compare each node's
  ledger with the watchers' view of the API (`shared.domain.reconcile.diff_node`) and repair any node that
  differs by one atomic `replace_node`: missing holders booked, stale ones dropped (after the API
  server confirmed, pod by pod, that they are gone), usage recomputed from reservations, cards as
  the node reports them. Each repair is logged with the difference and counted.
Only runs while both watch streams are live: a stale view must never "repair" a correct ledger.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from typing import Any

from controller.node_watch import NodeWatcher
from controller.pod_watch import PodWatcher, pod_ref, unaccounted
from shared.config import Config
from shared.domain.annotations import ALLOCATED, AnnotationError, PodUsage, usage_from_annotations
from shared.domain.node import Inventory, node_inventory
from shared.domain.quota import is_terminal
from shared.domain.reconcile import (
    NodeDiff,
    Unrecorded,
    diff_node,
    offers_cards,
    opens_up,
    quarantine_reason,
    recovered_usage,
    summarize,
)
from shared.domain.state import NodeSnapshot
from shared.domain.timing import KEEP_MS
from shared.domain.trust import foreign_fate, foreign_record
from shared.kube import Kube, KubeError, the_list
from shared.serving.metrics import (
    ANNOTATION_ERRORS,
    LEDGER_REBUILDS,
    NODES_VERIFIED,
    RECONCILE_LAST,
    RECONCILE_REPAIRS,
    RECONCILE_RUNS,
    RECONCILE_SECONDS,
    RECONCILE_TOUCHED,
    REDIS_PARTITION_RISK,
    RELEASES,
)
from shared.serving.supervise import is_transient
from shared.store.ledger import Ledger, verified_by

log = logging.getLogger("mtsched.reconciler")

PASS_GAP_SECONDS = 0.5  # the least time between the end of a pass over every node and the start of the next (and
# at least as long as that pass took: `run`)
PER_NODE_READS = 16  # up to this many nodes' pods are read node by node (_read_truth); more, in one list


class Reconciler:
    def __init__(self, kube: Kube, ledger: Ledger, cfg: Config, nodes: NodeWatcher, pods: PodWatcher,
                 check_seconds: float = 2.0, keep_ms: int = KEEP_MS):
        self.kube = kube
        self.ledger = ledger
        self.cfg = cfg
        self.nodes = nodes
        self.pods = pods
        self.check_seconds = check_seconds
        self.interval = float(cfg.reconcile_seconds)
        self.keep_ms = keep_ms  # reservations younger than this are newer than any view: never judged
        self.wake = asyncio.Event()  # a pass over every node, soon
        self.touched: set[str] = set()  # nodes to compare soon (touch), short of a pass over every node
        self._postponed = ""  # why the last pass was postponed ("" when it was not): logged once per episode
        self._touch = asyncio.Event()
        self.rebuilds = 0
        self.repairs = 0
        self.last_pass: dict[str, Any] = {}
        self.partition_risk = ""  # what Ledger.partition_risk last said
        self.evicted: dict[str, int] = {}  # each Redis primary's evicted_keys as last read (evictions_reset)
        # after each round of `run` that completed (the intact check, and the pass it owed): Supervisor.progress.
        # A round that fails calls nothing, and the pass it owed is the next round's first (wake, touched).
        self.on_progress: Callable[[], None] = lambda: None
        self._owed_failed = False  # the last pass tried (whole or of touched nodes) failed: it is owed still
        for r in (nodes.reflector, pods.reflector):
            r.on_resync.append(self.wake.set)

    # -- full rebuild ------------------------------------------------------------------------------

    async def rebuild(self, why: str = "start") -> dict[str, int]:
        # The node watcher waits meanwhile (its events are handled after, on top of this): the nodes are
        # written from this rebuild's own list, and its view (`last`, `known`) replaced by that list.
        async with self.nodes.lock:
            return await self._rebuild(why)

    async def _rebuild(self, why: str) -> dict[str, int]:
        t0 = time.monotonic()
        mark = self.nodes.events.offers  # the node events received before the list: none newer than it
        node_objs, list_rv = await self.nodes.reflector.list()
        # when the consistent read of the pods began, by node (what may verify a node of another Redis history
        # whose keep window is over; nodes the list lacks are read again by the pass that follows)
        began = await self.ledger.clocks([str((n.get("metadata") or {}).get("name")) for n in node_objs])
        pod_objs, _ = await self.pods.reflector.list()
        by_name = {inv.node: inv for inv in (node_inventory(n, self.cfg) for n in node_objs) if offers_cards(inv)}
        bound: dict[str, tuple[PodUsage, str]] = {}
        lost: dict[str, list[Unrecorded]] = {}
        for pod in pod_objs:
            if is_terminal(pod) or not (pod.get("spec") or {}).get("nodeName"):
                continue
            if str((pod.get("metadata") or {}).get("uid")) in self.pods.ended:
                # the pod stream saw it end since this list was read (a uid never comes back): not booked. Its
                # release's tombstone would keep the rebuild from booking it too, unless the node was removed and
                # written anew meanwhile (remove_node takes the tombstones with it)
                continue
            usage: PodUsage | None = None
            try:
                usage, foreign = self._record(pod)
            except AnnotationError as e:
                ANNOTATION_ERRORS.inc()
                log.error("rebuild: pod %s has an undecodable allocation record: %s", pod_ref(pod), e)
            else:
                if foreign:
                    log.error("rebuild: pod %s carries an allocation record although %s: %s", pod_ref(pod),
                              foreign, foreign_fate(unaccounted(pod, self.cfg) is not None))
            if usage is None and (u := unaccounted(pod, self.cfg)) is not None:
                # no readable record: what survives on the pod, or the node stays closed (fail closed)
                usage = recovered_usage(u, by_name.get(u.node))
                if usage is None:
                    lost.setdefault(u.node, []).append(u)
            if usage is not None:
                bound[str(pod["metadata"]["uid"])] = (usage, pod_ref(pod))
        invs = [replace(inv, error=quarantine_reason(lost[n])) if n in lost and not inv.error and inv.cards else inv
                for n, inv in by_name.items()]
        # a node the watcher holds closed, its change newer than this list still to write: written closed
        stuck = self.nodes.stuck_past(list_rv, mark)
        invs = [self.nodes.effective(inv) if inv.node in stuck else inv for inv in invs]
        # Reservations made since our lists began are newer than their truth: kept (measured on Redis's
        # clock by the script; the elapsed time is ours, which is fine for a duration).
        keep_ms = int((time.monotonic() - t0) * 1000) + self.keep_ms
        # keep_bound: where Redis still holds our bind's booking, a record changed since does not replace it.
        # freed: bookings no live pod explains (their pods went while no watcher ran) are dropped, and
        # kube-scheduler is nudged about their nodes, as after a repair
        # verify_after_ms: a node Redis's process has not verified (restarted with data, failed over) is
        # verified only a keep window after it was first found so, when a bind in flight then is in the API
        # (the pass that follows, or the touch it schedules, does it)
        # lost: nodes new to Redis wait the keep window too (Redis may have lost them with a booking a bind in
        # flight holds), unless nothing can be in flight: a start while no live pod is ours (a new install, or
        # an idle cluster; a bind in flight needs a pod of ours that exists). Nodes Redis has are unaffected.
        ours = any(not is_terminal(p) and (p.get("spec") or {}).get("schedulerName") == self.cfg.scheduler_name
                   for p in pod_objs)
        gone = why != "start" or ours
        # the ledger as it was: a node this rebuild opens up (a new configuration's card model or higher slice limit,
        # written by the new release's first rebuild) is nudged, as a rise the node watcher sees is: kube-scheduler
        # parked its pods against the old one, and no Node event follows a configuration change
        before = (await self.ledger.reread([i.node for i in invs], {}, isolate=True)).snaps
        stats = await self.ledger.rebuild(invs, bound, keep_ms=keep_ms, keep_bound=True,
                                          freed=self.pods.nudger.nudge, verify_after_ms=self.keep_ms, lost=gone,
                                          truth_at=began)
        if stats["verified"]:
            NODES_VERIFIED.inc(stats["verified"])
            log.info("rebuild verified %d node(s) against the API server again after Redis's history changed",
                     stats["verified"])
        for inv in invs:
            if opens_up(before.get(inv.node), inv):
                self.pods.nudger.nudge(inv.node)
        self.nodes.known = {i.node for i in invs} | {u.node for u, _ in bound.values()}
        self.nodes.last = by_name  # the API's view; a quarantine is applied on top (NodeWatcher.effective)
        # queued node events older than this list would be handled after it, over it (NodeWatcher.supersede)
        self.nodes.supersede(list_rv, mark)
        self.pods.seen = {}
        if not self.pods.reflector.synced.is_set():
            # first start: seed the pod view from the same list, so nodes written before the pod
            # stream has synced get their holders' usage
            for pod in pod_objs:
                if not is_terminal(pod):
                    self.pods.learn(str((pod.get("metadata") or {}).get("uid")), pod)
        elif self.pods.ended:
            # a pod deleted between our list and the rebuild was released before it, its uid tombstoned, so the
            # rebuild left it out (replace_node's `ended`); given back again all the same, a belt, where a release
            # left no tombstone (an older release's watcher, a node Redis did not hold, a Redis that lost it):
            # the watch knows it is gone. Given back where the rebuild booked it (the mirror has not read the
            # rebuild yet: it shows the pod released), and where the mirror lists it
            # (the mirror's bookings indexed once: a scan of every node per ended pod held the loop seconds with
            # 50,000 ended pods at 1,000 nodes, a review's measure)
            listed = {uid: node for node, snap in self.pods.mirror.nodes.items() for uid in snap.reservations}
            for uid in list(self.pods.ended):
                booked = bound.get(uid)
                for node in dict.fromkeys(n for n in (booked[0].node if booked else None, listed.get(uid)) if n):
                    if await self.ledger.release(node, uid, ended=True):
                        RELEASES.labels("gone").inc()
                        self.pods.nudger.nudge(node)
        self.rebuilds += 1
        LEDGER_REBUILDS.labels(why).inc()
        # every node written from the API: as good as a pass (else the gauge says 0, "never", until the first
        # pass, reconcileSeconds after a start, and MtschedLedgerNotReconciled fired after every restart)
        RECONCILE_LAST.set_to_current_time()
        log.info("ledger rebuilt from the API server (%s): %s", why, stats)
        self.wake.set()  # and compared with the live view soon after
        return stats

    def _record(self, pod: Mapping[str, Any]) -> tuple[PodUsage | None, str]:
        """What a pod's allocation record books (None: no record, or one not to book), and why a record is
        not ours to book ("" when it is); AnnotationError when it cannot be decoded."""
        if ALLOCATED not in ((pod.get("metadata") or {}).get("annotations") or {}):
            return None, ""
        foreign = foreign_record(pod, self.cfg)
        return (None, foreign) if foreign else (usage_from_annotations(pod), "")

    async def _read_truth(self, nodes: list[str]) -> dict[str, dict[str, tuple[PodUsage, str]]]:
        """The recorded pods bound to `nodes`, read consistently from the API server (not from a watch, which may
        lag): a Binding committed before the read began is in it. What verifies a node of another Redis history
        (replace_node's truth_at: the caller reads Redis's clock first, shared/domain/timing.py)."""
        if len(nodes) <= PER_NODE_READS:
            pods: list[dict[str, Any]] = []
            for node in nodes:
                got = await self.kube.request("GET", "/api/v1/pods", query={"fieldSelector": f"spec.nodeName={node}"})
                pods.extend(the_list(got, f"GET pods on {node}"))  # (else 502, never "no pods")
        else:  # one list of every pod rather than thousands of small ones
            pods, _ = await self.pods.reflector.list()
        wanted = set(nodes)
        out: dict[str, dict[str, tuple[PodUsage, str]]] = {n: {} for n in nodes}
        for pod in pods:
            node = str((pod.get("spec") or {}).get("nodeName") or "")
            if node not in wanted or is_terminal(pod):
                continue
            try:  # a pod without a readable record of ours is no bind of ours: the view's holders have it
                usage, _ = self._record(pod)
            except AnnotationError:
                continue
            if usage is not None and usage.node == node:
                out[node][str((pod.get("metadata") or {}).get("uid"))] = (usage, pod_ref(pod))
        return out

    # -- anti-entropy ------------------------------------------------------------------------------

    def _views(self, only: set[str] | None = None) -> tuple[dict[str, Inventory], dict[str, dict[str, PodUsage]],
                                                            dict[str, str]]:
        """The watchers' view: each node (of `only`) as the ledger must hold it, and what each live pod holds."""
        last = self.nodes.last
        nodes = last.items() if only is None else ((n, last[n]) for n in only if n in last)
        invs = {n: self.nodes.effective(i) for n, i in nodes}
        holders: dict[str, dict[str, PodUsage]] = {}
        refs: dict[str, str] = {}
        for node, held in self.pods.holders_by_node(only).items():
            for uid, (usage, ref) in held.items():
                holders.setdefault(node, {})[uid] = usage
                refs[uid] = ref
        return invs, holders, refs

    async def _confirm(self, node: str, snap: NodeSnapshot, uid: str) -> tuple[str, PodUsage | None]:
        """Asks the API server about a reservation no live holder explains: ("stale", None) when its pod
        is gone, ended, elsewhere, or unbound while the booking is bound; ("unbound", None) for a pending booking
        whose pod is not bound yet (its Binding may be in flight: left to the janitor's TTL); ("held", usage)
        when the pod holds it after all (our view lagged, or its record is unreadable: then the ledger's booking
        is kept as it is)."""
        res = snap.reservations[uid]
        ns, _, name = res.pod.partition("/")
        kept = PodUsage(node, res.cards, res.mem, res.cores, res.slices)
        if not ns or not name:
            return "stale", None  # no pod name was recorded: nothing in the API can hold it
        try:
            pod = await self.kube.get_pod(ns, name)
        except KubeError as e:
            if e.status == 404:
                return "stale", None
            if is_transient(e):
                raise
            # e.g. 403 (RBAC lacks get pods): we cannot tell, so the booking stays as it is (fail closed)
            RECONCILE_REPAIRS.labels("unconfirmed").inc()
            log.error("reconcile: cannot ask the API server about %s (%s): its reservation on %s is kept",
                      res.pod, e, node)
            return "held", kept
        meta = pod.get("metadata") or {}
        if str(meta.get("uid")) == uid and not is_terminal(pod) and not (pod.get("spec") or {}).get("nodeName") \
                and res.state == "pending":
            return "unbound", None  # its Binding may be in flight: the janitor's (expired after the TTL)
        if str(meta.get("uid")) != uid or is_terminal(pod) or (pod.get("spec") or {}).get("nodeName") != node:
            return "stale", None  # another pod of that name, ended, or not bound here
        foreign = foreign_record(pod, self.cfg)
        if foreign and unaccounted(pod, self.cfg) is None:
            return "stale", None  # our bind never books such a pod, and it asks for no card
        try:
            usage = None if foreign else usage_from_annotations(pod)
        except AnnotationError:
            return "held", kept  # fail closed: an unreadable record keeps the booking
        if usage is None:
            # bound here and asking for cards, with no record: keep the booking rather than free a card a
            # running container may use (an alert-worthy state, counted)
            RECONCILE_REPAIRS.labels("kept_unrecorded").inc()
            return "held", kept
        return ("held", usage) if usage.node == node else ("stale", None)

    async def reconcile_node(self, node: str, snap: NodeSnapshot | None, inv: Inventory | None,
                             holders: dict[str, PodUsage], refs: dict[str, str], now_ms: int,
                             held_at: Mapping[str, Collection[str]] | None = None,
                             read: tuple[int, Mapping[str, tuple[PodUsage, str]]] | None = None) -> NodeDiff:
        """`held_at`: the nodes where each pod holds cards, by the view or by a bound booking in the ledger
        (pending bookings here of a pod held elsewhere are judged, and confirmed with the API server before
        anything is freed: diff_node's `elsewhere`). `read`: (when it began, the recorded pods bound here) read
        consistently from the API server (_read_truth), for a node not verified under Redis's history: they
        are booked with the view's holders, and only such a read may verify the node."""
        where = held_at or {}
        truth_at, listed = read if read is not None else (None, {})
        if listed:
            holders = dict(holders)
            for uid, (recorded, ref) in listed.items():
                if uid not in self.pods.ended and uid not in holders:
                    holders[uid] = recorded
                    refs.setdefault(uid, ref)
        elsewhere = {u for u in (snap.reservations if snap is not None else ()) if set(where.get(u, ())) - {node}}
        diff = diff_node(node, snap, inv, holders, now_ms, self.keep_ms, elsewhere)
        if diff.clean:
            return diff
        if diff.remove:
            async with self.nodes.lock:
                if self._moved(node, inv):
                    return diff
                if await self.ledger.remove_node(node, self.keep_ms) is None:
                    if snap is not None and not snap.verified:
                        # kept as unverified (removed, it would come back new): written from the truth (nothing
                        # held) and verified after the keep window, when a later pass can remove it
                        kept = {u: x for u, x in listed.items() if u not in self.pods.ended}
                        self.verify_later(node, await self.ledger.replace_node(
                            Inventory(node), kept, self.keep_ms, keep_bound=True, verify_after_ms=self.keep_ms,
                            truth_at=truth_at))
                    return diff  # a reservation was made or bound there since our read: judged on a later pass
            self.nodes.known.discard(node)
            RECONCILE_REPAIRS.labels("node_gone").inc()
            log.warning("reconcile: node %s is gone from the API and holds nothing: removed", node)
            return diff
        truth = dict(holders)
        stale: list[str] = []
        if snap is not None:
            for uid in diff.suspects:
                verdict, usage = await self._confirm(node, snap, uid)
                if verdict == "held" and usage is not None:
                    truth[uid] = usage
                    refs.setdefault(uid, snap.reservations[uid].pod)
                elif verdict != "unbound":  # (unbound: kept, pending: replace_node keeps it, the janitor ends it)
                    stale.append(uid)
            # the API may have answered that every suspect is held after all, as booked: then only the
            # other differences (if any) need a repair
            diff = diff_node(node, snap, inv, truth, now_ms, self.keep_ms, elsewhere)
        if not diff.differences and not stale:
            return diff
        counts = summarize(diff.differences)
        if stale:
            counts["stale_holder"] = len(stale)
        for kind, n in counts.items():
            RECONCILE_REPAIRS.labels(kind).inc(n)
        log.warning("reconcile: repairing node %s: %s; %s%s", node, counts,
                    "; ".join(d.detail for d in diff.differences[:10]),
                    f"; stale reservations of {stale[:10]}" if stale else "")
        # Sent with the view as it is now (events went on while we asked the API server), and never with a
        # pod this watcher saw deleted: its release is done, and nothing would release it again.
        final = {uid: (u, t) for uid, (u, t) in self.pods.holders(node).items() if uid not in self.pods.ended}
        for uid in truth.keys() - holders.keys() - self.pods.ended.keys():
            final.setdefault(uid, (truth[uid], refs.get(uid, "")))
        for uid, held in listed.items():  # bound since the view was taken (its watch lags): in the truth
            if uid not in self.pods.ended:
                final.setdefault(uid, held)
        # Under the node watcher's lock, and only if the node is still as this pass saw it: a Node change
        # handled while we asked the API server is in Redis already, and the older copy must not replace it.
        async with self.nodes.lock:
            if self._moved(node, inv):
                return diff
            await self.ledger.list_node(node)
            # kept: whatever was made or bound since `now_ms - keep_ms`, however long this pass took since its read
            # a node the watchers knew, missing from Redis: its keys went (a shard back empty) with bookings
            # binds in flight may still hold, so it waits the keep window like a node of a changed history
            lost = snap is None and node in self.nodes.known
            out = await self.ledger.replace_node(inv if inv is not None else Inventory(node), final, self.keep_ms,
                                                 keep_bound=True, keep_from=now_ms - self.keep_ms,
                                                 verify_after_ms=self.keep_ms, lost=lost, truth_at=truth_at)
        self.verify_later(node, out)
        # `final` was read before this write's Redis calls (the lock's wait, list_node)
        await self.nodes.release_ended(node, final, self.pods.ended, "the node was repaired")
        # a pending booking is kept by replace_node (its binder may be mid-flight): one the API showed stale (its
        # pod bound on another node, or gone) is released by uid
        for uid in stale:
            if snap is not None and snap.reservations[uid].state == "pending" and await self.ledger.release(node, uid):
                log.warning("reconcile: released %s's pending booking on %s: %s", uid, node,
                            refs.get(uid) or snap.reservations[uid].pod or "its pod is bound elsewhere or gone")
        if int(out.get("pending_overfull") or 0):
            # newer than our truth and kept (their binders go on), but over-filling a card next to it: said
            # out loud; the card offers nothing more until they bind or expire
            RECONCILE_REPAIRS.labels("kept_overfull").inc(int(out["pending_overfull"]))
            log.warning("reconcile: node %s: %s reservation(s) newer than the view over-fill a card next to it; "
                        "kept (their binds are in flight), the card offers nothing more", node,
                        out["pending_overfull"])
        self.nodes.known.add(node)
        self.repairs += 1
        # a repair may free cards (stale bookings dropped): pods kube-scheduler parked after our filter
        # refused them there are retried now, not at its 5-minute flush
        self.pods.nudger.nudge(node)
        return diff

    def _moved(self, node: str, inv: Inventory | None) -> bool:
        """Whether the node watcher's view of `node` changed since this pass took `inv`: then the repair is
        left to a pass of that node soon (touched), made from the newer view."""
        now = self.nodes.last.get(node)
        if (self.nodes.effective(now) if now is not None else None) == inv:
            return False
        log.info("reconcile: node %s changed while it was compared: compared again", node)
        self.touch(node)
        return True

    def views_live(self) -> str:
        """Why the watchers' view cannot be trusted now ("" when it can)."""
        return self.nodes.problem(0) or self.pods.reflector.problem(0)

    def verify_later(self, node: str, written: Mapping[str, Any]) -> None:
        """`written`: replace_node's answer for `node` (every one of the watcher's, the node watcher's too).
        Written from the truth but not verified yet (Redis's history changed less than the keep window ago):
        compared again once a bind that was in flight then is in the view. Verified by this very write: said."""
        if verified_by(written):
            NODES_VERIFIED.inc()
            log.info("node %s verified against the API server again after Redis's history changed", node)
        if not written.get("verified", True):
            ms = int(written.get("verify_in_ms") or 0)
            asyncio.get_running_loop().call_later(ms / 1000 + 0.1, self.touch, node)

    def touch(self, node: str) -> None:
        """Compare this node soon (the pod watcher: a pod bound there without a record came or went); no
        node named: every node."""
        if not node:
            self.wake.set()
            return
        self.touched.add(node)
        self._touch.set()

    async def reconcile_all(self) -> dict[str, int]:
        """One pass over every node the ledger or the API knows; returns the repairs made, by kind."""
        return await self._pass(None)

    async def reconcile_nodes(self, nodes: set[str]) -> dict[str, int]:
        """The same comparison, for these nodes only (those the ledger or the API knows)."""
        return await self._pass(nodes)

    async def _read(self, names: list[str]) -> tuple[dict[str, NodeSnapshot], set[str]]:
        """Every node's snapshot as Redis holds it now, and the nodes that cannot be read while their Redis Cluster
        slot is moving between shards (left out of the pass: Redis runs no script there, and a pass that failed on
        one of them repaired no node at all until the move ended). A reply that is the very text the watcher's
        mirror decoded its snapshot of the node from is not decoded again: the mirror's snapshot is that value (at
        5,000 nodes decoding every node every pass was most of a pass's CPU). One the mirror changed since is read
        again."""
        mirror = self.pods.mirror
        read = await self.ledger.reread(names, mirror.digests(names), isolate=True, apart=mirror.moving)
        snaps = dict(read.snaps)
        again = []
        for node in read.unchanged:
            snap = mirror.decoded_as(node, read.digests[node])
            if snap is not None:
                snaps[node] = snap
            else:
                again.append(node)  # the mirror moved on while this pass read: read that node once more
        if again:
            snaps.update(await self.ledger.snapshots(again))
        for node, snap in read.snaps.items():
            mirror.learn_digest(node, read.digests[node], snap)  # the mirror's copy is this reply: the next pass
        for node in read.moving:
            mirror.note_moving(node)
        return snaps, read.moving

    async def _pass(self, only: set[str] | None) -> dict[str, int]:
        t0 = time.monotonic()
        invs, holders, _ = self._views(only)
        listed = set(await self.ledger.nodes())
        names = listed | {n for n, i in invs.items() if offers_cards(i)} | set(holders)
        if only is not None:
            names &= only
        now_ms = await self.ledger.redis_time_ms()  # before the read: what is newer than it, the read lacks
        snaps, moving = await self._read(sorted(names))
        if moving:  # compared again once the mirror reads them (a later pass)
            log.info("reconcile: %d node(s) left out while their Redis Cluster slot moves: %s", len(moving),
                     ", ".join(sorted(moving)[:5]))
            names -= moving
        for node in sorted(snaps.keys() - listed):
            # its keys exist but `mt:nodes` lost it (an edit, or a remove racing a re-create): mirrors only
            # read listed nodes, so every replica would call it unregistered
            await self.ledger.list_node(node)
            await self.ledger.announce(node)
            RECONCILE_REPAIRS.labels("unlisted").inc()
            log.warning("reconcile: node %s was missing from %s: listed again", node, self.ledger.nodes_key)
        # The view is taken after the ledger was read: a pod released meanwhile is then missing from both,
        # while a view older than the read would book it again, with nobody left to release it.
        invs, holders, refs = self._views(None if only is None else names)
        every: Mapping[str, Mapping[str, Any]] = holders if only is None else self.pods.holders_by_node(None)
        held_at: dict[str, set[str]] = {}
        for where, held in every.items():
            for uid in held:
                held_at.setdefault(uid, set()).add(where)
        for where, snap in snaps.items():  # a pod's bound booking in the ledger says where our bind placed it
            for uid, r in snap.reservations.items():
                if r.state == "bound":
                    held_at.setdefault(uid, set()).add(where)
        # nodes of another Redis history whose keep window is over: written from a consistent read of their
        # pods, which alone may verify them (one in its window, or whose window this pass starts, is written
        # from the view: reading the API server for it would be for nothing)
        waiting = sorted(n for n, snap in snaps.items() if not snap.verified and snap.unverified_since)
        began = await self.ledger.clocks(waiting) if waiting else {}  # each on its node's own clock
        fenced = [n for n in waiting if snaps[n].unverified_since <= began[n] - self.keep_ms]
        recorded = await self._read_truth(fenced) if fenced else {}
        repaired: dict[str, int] = {}
        for node in sorted(names):
            read = (began[node], recorded[node]) if node in recorded else None
            diff = await self.reconcile_node(node, snaps.get(node), invs.get(node), holders.get(node, {}), refs,
                                             now_ms, held_at, read)
            if not diff.clean:
                for kind, n in summarize(diff.differences).items():
                    repaired[kind] = repaired.get(kind, 0) + n
        if only is not None:
            RECONCILE_TOUCHED.labels("repaired" if repaired else "clean").inc()
            return repaired
        await self._check_partition_risk()
        RECONCILE_SECONDS.observe(time.monotonic() - t0)
        RECONCILE_RUNS.labels("repaired" if repaired else "clean").inc()
        RECONCILE_LAST.set_to_current_time()
        self.last_pass = {"nodes": len(names), "repaired": repaired, "seconds": round(time.monotonic() - t0, 3)}
        return repaired

    async def _check_partition_risk(self) -> None:
        """Say (once per change, and by a gauge) when Redis is set up so that the fence cannot see every lost
        booking (Ledger.partition_risk): a deployment requirement, checked where the fence is run."""
        risk = await self.ledger.partition_risk()
        REDIS_PARTITION_RISK.set(1 if risk else 0)
        if risk and risk != self.partition_risk:
            log.warning("redis: %s (docs/install.md, External Redis: Sentinel or Cluster)", risk)
        self.partition_risk = risk

    # -- the loop ----------------------------------------------------------------------------------

    async def run(self) -> None:
        """Errors reach the supervisor, which restarts this loop with backoff."""
        loop = asyncio.get_running_loop()
        next_pass = loop.time() + self.interval
        while True:
            counts = await self._evicted_counts()
            if self.nodes.lost.is_set() or not await self.ledger.intact():
                why = "node missing" if self.nodes.lost.is_set() else "state lost"
                self.nodes.lost.clear()
                await self.rebuild(why)
                self.evicted.update(counts)  # written from the API just now: no second rebuild for a count reset
            elif self.evictions_reset(counts):
                await self.rebuild("eviction count reset")
                self.evicted.update(counts)  # only once rewritten: a rebuild that failed is tried again
            full = self.wake.is_set() or loop.time() >= next_pass
            if full or self.touched:
                if why_not := self.views_live():
                    # said at info once per episode (the runbook's MtschedLedgerNotReconciled points here; the
                    # reason carries a running count of seconds, so only the episode's start is compared)
                    (log.debug if self._postponed else log.info)("reconcile postponed: %s", why_not)
                    self._postponed = why_not
                    # Redis answered the check: waiting for the streams is no failure of ours; but a pass that
                    # failed is owed, and none until one works (a stream's blip between two failed passes wiped their
                    # count: tests/redis/test_redteam_reconciler_progress.py)
                    if not self._owed_failed:
                        self.on_progress()
                    await asyncio.sleep(self.check_seconds)
                    continue
                if self._postponed:
                    log.info("reconcile resumed: the watch streams are live again")
                self._postponed = ""
                # taken before the read: a node touched during the pass is compared again after it
                nodes, self.touched = self.touched, set()
                self._touch.clear()
                if full:
                    self.wake.clear()
                    started = loop.time()
                    try:
                        await self.reconcile_all()
                    except BaseException:
                        # a full pass again after the supervisor's restart, not a reconcileSeconds later (an
                        # unverified node's comparison may be in it)
                        self.wake.set()
                        self._owed_failed = True
                        raise
                    # reconcileSeconds from this pass's start, not its end (and no later than due: `_woken`), so a
                    # drift the keep window spared at one pass is judged by a pass that ends within reconcileSeconds
                    # + the keep window + one pass of its making (docs/runbooks.md; before, up to a pass and a 2 s
                    # look later: tests/redis/test_heal_drift_bound.py). But a pass that took more than half of
                    # reconcileSeconds (thousands of nodes at a small one) is followed by a wait as long as it took:
                    # every pass reads every node, and back to back they held Redis, which every bind waits on, and
                    # the watcher most of the time (tests/redis/test_redteam_reconcile_spacing.py).
                    took = loop.time() - started
                    next_pass = max(started + self.interval, loop.time() + max(PASS_GAP_SECONDS, took))
                else:
                    try:
                        await self.reconcile_nodes(nodes)
                    except BaseException:
                        # compared again after the supervisor's restart, not only at the next full pass (an
                        # unverified node's second comparison is one of these)
                        self.touched |= nodes
                        self._touch.set()
                        self._owed_failed = True
                        raise
                self._owed_failed = False
            self.on_progress()
            if await self._woken(next_pass - loop.time()):
                await asyncio.sleep(0.5)  # coalesce a burst of wake-ups (e.g. both streams re-listing)

    async def _evicted_counts(self) -> dict[str, int]:
        """Ledger.evicted_counts, or nothing when Redis does not answer (the intact() check says so next)."""
        try:
            return await self.ledger.evicted_counts()
        except Exception as e:
            log.debug("evicted_keys not read: %s", e)
            return {}

    def evictions_reset(self, counts: Mapping[str, int]) -> bool:
        """Whether a Redis primary's evicted_keys (`counts`, Ledger.evicted_counts) went down since the last look
        (CONFIG RESETSTAT, or a restart the history token sees anyway). Every eviction changes the token the
        scripts verify nodes under (server_info in _lib.lua), but a count set back to 0 makes it a token nodes
        were verified under before keys were evicted: those nodes are written from the API again, now (a
        rebuild), rather than trusted. The counts are taken as seen only when nothing went down; the caller
        takes them after its rebuild."""
        lower = sorted(s for s, n in counts.items() if n < self.evicted.get(s, 0))
        if lower:
            log.warning("redis: the eviction count of %s went down (CONFIG RESETSTAT?): every node is written from "
                        "the API server again", ", ".join(s or "the server" for s in lower))
            return True
        self.evicted.update(counts)
        return False

    async def _woken(self, due: float) -> bool:
        """Wait up to check_seconds, and no longer than `due` (seconds until the next pass, at least 0), for a request
        of a pass (whole or of touched nodes); True if one came."""
        waits = [asyncio.ensure_future(self.wake.wait()), asyncio.ensure_future(self._touch.wait())]
        try:
            done, _ = await asyncio.wait(waits, timeout=max(0.0, min(self.check_seconds, due)),
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        return bool(done)
