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
import logging
import time
from collections.abc import Mapping
from typing import Any

from controller.kube import Kube
from controller.reflector import Reflector
from shared.annotations import ALLOCATED, AnnotationError, PodUsage, usage_from_annotations
from shared.config import Config
from shared.ledger import Ledger, LedgerError
from shared.metrics import ANNOTATION_ERRORS, OVERCOMMIT, RELEASES, WATCH_EVENTS
from shared.mirror import Mirror
from shared.node import Inventory, node_inventory
from shared.state import NodeSnapshot

log = logging.getLogger("mtsched.watchers")


def pod_ref(pod: dict[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def is_terminal(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


class NodeWatcher:
    def __init__(self, kube: Kube, ledger: Ledger, cfg: Config):
        self.ledger = ledger
        self.cfg = cfg
        self.last: dict[str, Inventory] = {}
        self.known: set[str] = set()  # nodes this watcher has seen in the ledger
        self.lost = asyncio.Event()  # set when Redis turned out to have lost a known node
        self.reflector = Reflector(kube, "/api/v1/nodes", self.on_event, self.on_sync, "nodes")

    async def _upsert(self, inv: Inventory) -> None:
        if self.last.get(inv.node) == inv:
            return  # heartbeats and unrelated status changes don't touch the ledger
        if inv.error:
            log.warning("node %s offers no card: %s", inv.node, inv.error)
        if not inv.cards and not inv.error:
            if inv.node in self.last or inv.node in self.known:
                await self.ledger.remove_node(inv.node)  # no longer a sliced-card node
                self.last.pop(inv.node, None)
                self.known.discard(inv.node)
            return
        # Only a node new to us may be created; a known node missing from Redis means lost state.
        if await self.ledger.upsert_node(inv, create=inv.node not in self.known) < 0:
            log.error("node %s is missing from Redis: state lost, rebuilding from the API server", inv.node)
            self.lost.set()
            return
        self.known.add(inv.node)
        self.last[inv.node] = inv

    async def on_event(self, kind: str, node: dict[str, Any]) -> None:
        WATCH_EVENTS.labels("node", kind).inc()
        name = str((node.get("metadata") or {}).get("name"))
        if kind == "DELETED":
            await self.ledger.remove_node(name)
            self.last.pop(name, None)
            self.known.discard(name)
            return
        await self._upsert(node_inventory(node, self.cfg))

    async def on_sync(self, nodes: list[dict[str, Any]]) -> None:
        invs = [node_inventory(n, self.cfg) for n in nodes]
        self.last = {k: v for k, v in self.last.items() if k in {i.node for i in invs}}
        for inv in invs:
            self.last.pop(inv.node, None)  # force a write: the ledger may have been flushed
            await self._upsert(inv)
        live = {i.node for i in invs if i.cards or i.error}
        for name in set(await self.ledger.nodes()) - live:
            await self.ledger.remove_node(name)


FREED_ANNOTATION = "mtsched.io/capacity-freed"


class Nudger:
    """Tells kube-scheduler that a node gained card capacity, by touching a node annotation.

    kube-scheduler retries pods the extender rejected only on cluster events. When a pod is deleted
    it retries at once, usually before the watcher has released the pod's share, and the pod would
    then wait for an unrelated event (up to 5 minutes). The annotation change is such an event, sent
    after the release. Coalesced per node, so churn costs at most one patch per node per interval.
    """

    def __init__(self, kube: Kube, interval: float = 0.5):
        self.kube = kube
        self.interval = interval
        self._pending: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.sent = 0

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
        body = {"metadata": {"annotations": {FREED_ANNOTATION: str(int(time.time() * 1000))}}}
        try:
            await self.kube.request("PATCH", f"/api/v1/nodes/{node}", body,
                                    content_type="application/merge-patch+json")
            self.sent += 1
        except Exception as e:
            log.debug("could not nudge the scheduler about %s: %s", node, e)


class PodWatcher:
    def __init__(self, kube: Kube, ledger: Ledger, mirror: Mirror, cfg: Config, lost: asyncio.Event,
                 grace_seconds: float = 10.0):
        self.lost = lost
        self.kube = kube
        self.nudger = Nudger(kube)
        self.ledger = ledger
        self.mirror = mirror
        self.cfg = cfg
        self.grace_ms = int(grace_seconds * 1000)
        self.seen: dict[str, str] = {}  # uid -> allocation annotation already recorded
        self.live: set[str] = set()  # uids of pods that exist and have not ended, as the watch says
        self.ended: dict[str, float] = {}  # uid -> when the watch saw it deleted or ended (last 10 minutes)
        self.reflector = Reflector(kube, "/api/v1/pods", self.on_event, self.on_sync, "pods")

    async def release(self, uid: str, pod: dict[str, Any], why: str) -> None:
        self.seen.pop(uid, None)
        self.live.discard(uid)
        now = time.monotonic()
        self.ended[uid] = now
        if len(self.ended) > 50000:
            self.ended = {u: t for u, t in self.ended.items() if now - t < 600}
        node = self.mirror.owner_of(uid) or (pod.get("spec") or {}).get("nodeName")
        if node and await self.ledger.release(str(node), uid):
            RELEASES.labels(why).inc()
            self.nudger.nudge(str(node))
            log.info("released %s (%s) on %s: %s", pod_ref(pod), uid, node, why)

    async def record(self, uid: str, pod: dict[str, Any]) -> None:
        raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(ALLOCATED)
        if raw is None or self.seen.get(uid) == raw or not (pod.get("spec") or {}).get("nodeName"):
            return
        try:
            usage: PodUsage | None = usage_from_annotations(pod)
        except AnnotationError as e:
            # Fail closed: keep whatever the ledger holds for this pod rather than freeing capacity.
            ANNOTATION_ERRORS.inc()
            log.error("pod %s has an undecodable allocation record, its usage is kept: %s", pod_ref(pod), e)
            self.seen[uid] = raw
            return
        if usage is None:
            return
        try:
            out = await self.ledger.observe(uid, usage, pod_ref(pod))
        except LedgerError as e:
            log.error("cannot record %s: %s", pod_ref(pod), e)
            return
        if not out.get("ok"):
            log.error("cannot record %s on %s: %s; rebuilding", pod_ref(pod), usage.node, out.get("reason"))
            self.lost.set()
            return
        if out.get("overcommit"):
            OVERCOMMIT.inc()
            log.error("pod %s over-commits card(s) %s on %s (recorded as the API server says)", pod_ref(pod),
                      usage.cards, usage.node)
        self.seen[uid] = raw

    async def on_event(self, kind: str, pod: dict[str, Any]) -> None:
        WATCH_EVENTS.labels("pod", kind).inc()
        uid = str((pod.get("metadata") or {}).get("uid"))
        if kind == "DELETED":
            await self.release(uid, pod, "deleted")
        elif is_terminal(pod):
            await self.release(uid, pod, (pod.get("status") or {}).get("phase", "ended").lower())
        else:
            self.live.add(uid)
            await self.record(uid, pod)

    async def on_sync(self, pods: list[dict[str, Any]]) -> None:
        """Reconcile after a (re-)list: record bound pods, release what belongs to pods that are gone."""
        live: dict[str, dict[str, Any]] = {}
        self.seen = {}
        for pod in pods:
            uid = str((pod.get("metadata") or {}).get("uid"))
            if is_terminal(pod):
                await self.release(uid, pod, "ended")
                continue
            live[uid] = pod
            await self.record(uid, pod)
        self.live = set(live)
        await self.reconcile(self.mirror.nodes)

    async def reconcile(self, snaps: Mapping[str, NodeSnapshot], ended_only: bool = False) -> None:
        """Release reservations of pods that are gone: after a re-list, those of pods not listed (sparing
        young ones, whose pod may be newer than the list); after a rebuild, those of pods the watch saw
        end, which the rebuild may have booked again from a list older than their deletion."""
        now = int(time.time() * 1000)
        for node, snap in list(snaps.items()):
            for uid, res in list(snap.reservations.items()):
                gone = uid in self.ended if ended_only else uid not in self.live and now - res.created > self.grace_ms
                if gone and await self.ledger.release(node, uid):
                    RELEASES.labels("gone").inc()
                    self.nudger.nudge(node)


class Rebuilder:
    """Recomputes the ledger from the API server at start and whenever Redis lost its state."""

    def __init__(self, ledger: Ledger, cfg: Config, nodes: NodeWatcher, pods: PodWatcher, interval: float = 2.0):
        self.ledger = ledger
        self.cfg = cfg
        self.nodes = nodes
        self.pods = pods
        self.interval = interval
        self.rebuilds = 0

    async def rebuild(self) -> dict[str, int]:
        started = int(time.time() * 1000)
        node_objs, _ = await self.nodes.reflector.list()
        pod_objs, _ = await self.pods.reflector.list()
        invs = [inv for inv in (node_inventory(n, self.cfg) for n in node_objs) if inv.cards or inv.error]
        bound: dict[str, tuple[PodUsage, str]] = {}
        for pod in pod_objs:
            if is_terminal(pod) or not (pod.get("spec") or {}).get("nodeName"):
                continue
            try:
                usage = usage_from_annotations(pod)
            except AnnotationError as e:
                ANNOTATION_ERRORS.inc()
                log.error("rebuild: pod %s has an undecodable allocation record: %s", pod_ref(pod), e)
                continue
            if usage is not None:
                bound[str(pod["metadata"]["uid"])] = (usage, pod_ref(pod))
        stats = await self.ledger.rebuild(invs, bound, keep_after_ms=started)
        self.nodes.known = {i.node for i in invs}
        self.nodes.last = {i.node: i for i in invs}
        self.pods.seen = {}
        if self.pods.reflector.synced.is_set():
            # a pod deleted between our list and the rebuild was released before it and booked again
            # by it: the watch knows it is gone
            await self.pods.reconcile(await self.ledger.snapshots(await self.ledger.nodes()), ended_only=True)
        self.rebuilds += 1
        log.info("ledger rebuilt from the API server: %s", stats)
        return stats

    async def run(self) -> None:
        while True:
            try:
                if self.nodes.lost.is_set() or not await self.ledger.intact():
                    self.nodes.lost.clear()
                    await self.rebuild()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("ledger check failed (%s); retrying", e)
            await asyncio.sleep(self.interval)


class Janitor:
    """Reclaims pending reservations whose binder died or gave up, after the TTL."""

    def __init__(self, ledger: Ledger, mirror: Mirror, cfg: Config, interval: float = 5.0,
                 nudger: Nudger | None = None):
        self.nudger = nudger
        self.ledger = ledger
        self.mirror = mirror
        self.ttl = cfg.pending_ttl_seconds
        self.interval = interval

    async def sweep(self) -> list[str]:
        now = int(time.time() * 1000)
        gone: list[str] = []
        for node, snap in list(self.mirror.nodes.items()):
            if any(r.state == "pending" and now - r.created > self.ttl * 1000 for r in snap.reservations.values()):
                expired = await self.ledger.expire(node, self.ttl)
                RELEASES.labels("expired").inc(len(expired))
                if expired and self.nudger:
                    self.nudger.nudge(node)
                gone.extend(expired)
        if gone:
            log.info("expired %d pending reservation(s) older than %ss", len(gone), self.ttl)
        return gone

    async def run(self) -> None:
        while True:
            try:
                await self.sweep()
            except Exception as e:  # keep sweeping through transient Redis errors
                log.warning("janitor sweep failed: %s", e)
            await asyncio.sleep(self.interval)
