"""Tells kube-scheduler a node gained card capacity (a node annotation touched), so the pods it turned away retry."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Iterable

from shared.domain.nudge import next_first, served
from shared.kube import Kube, KubeError
from shared.serving.metrics import NUDGES
from shared.serving.waits import within

log = logging.getLogger("mtsched.watchers")


FREED_ANNOTATION = "mtsched.io/capacity-freed"
RECENT_NODES = 8  # cluster-wide mode: Nodes kept to patch instead of one that is gone
KNOWN_TRIES = 3  # then Nodes that exist (known_nodes), at most this many


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

    `cluster_wide` (the setting nudgeAnyNode, which the chart derives from its kube-scheduler's version:
    shared/domain/nudge.py any_node_wakes): one Node's update wakes every pod the extender turned away, so the
    nudges of all Nodes are coalesced into one first patch per `interval` (of the Node asked last; the one asked
    before it if that one is gone, ..., then one of `known_nodes`) and one follow-up `follow_up` after the last of
    them: a release on a thousand Nodes is two Node writes, not two thousand, each of which every watcher of Nodes
    in the cluster would receive.

    `someone_waits` says whether a pod of our scheduler waits to be placed (the pod watcher's view), asked when a
    patch is due: with none, the patch wakes nobody and is not sent. Each is a Node write that every
    watcher of Nodes receives (kube-scheduler, node agents of CNIs and monitors on every node), so a
    steady cluster deleting pods no longer writes its Nodes for every deletion. A pod rejected just before
    a release and seen by the watch only later still gets the follow-up if the watch lags less than it.
    """

    def __init__(self, kube: Kube, interval: float = 0.5, follow_up: float = 5.0,
                 someone_waits: Callable[[], bool] = lambda: True, cluster_wide: bool = False):
        self.kube = kube
        self.interval = interval
        self.follow_up = follow_up
        self.someone_waits = someone_waits
        self._pending: set[str] = set()  # nodes whose first patch is still to be sent
        self._waiting: dict[str, asyncio.Event] = {}  # node -> set to drop the follow-up its task waits to send
        self._tasks: set[asyncio.Task[None]] = set()
        self.outcomes: dict[tuple[str, str], int] = {}  # (which, result) -> this nudger's patches, as NUDGES counts
        self.cluster_wide = cluster_wide
        # cluster-wide mode: the earliest and the latest ask no first patch has served yet (loop time), the Nodes
        # asked since the last first patch (the last one asked last; at most RECENT_NODES), the one task sending
        self._earliest: float | None = None
        self._latest = 0.0
        self._recent: dict[str, None] = {}
        # Nodes that exist (the role: the node watcher's view), tried when every Node asked is gone (a scale-down's
        # releases pushed the live one out of `_recent`)
        self.known_nodes: Callable[[], Iterable[str]] = tuple
        self._asked = asyncio.Event()
        self._sender: asyncio.Task[None] | None = None

    @property
    def sent(self) -> int:
        """Patches the API server took."""
        return sum(n for (_, result), n in self.outcomes.items() if result == "sent")

    def nudge(self, node: str) -> None:
        if self.cluster_wide:
            self._ask(node)
            return
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
            await within(superseded.wait(), self.follow_up)
            return
        except TimeoutError:
            pass
        finally:
            if self._waiting.get(node) is superseded:
                del self._waiting[node]
        if node not in self._pending:  # else a newer nudge sends both of its own
            await self._patch(node, "follow_up")

    def nudge_any(self) -> None:
        """Cluster-wide mode: a patch of whichever Node (one asked lately, else one of `known_nodes`), for pods
        turned away that no Node's release stands for (the watcher back after an outage: controller/upkeep.py)."""
        self._ask(None)

    def _ask(self, node: str | None) -> None:
        now = asyncio.get_running_loop().time()
        if self._earliest is None:
            self._earliest = now
        self._latest = now
        if node is not None:
            self._recent.pop(node, None)
            self._recent[node] = None
            while len(self._recent) > RECENT_NODES:
                del self._recent[next(iter(self._recent))]
        self._asked.set()
        if self._sender is None or self._sender.done():  # (done, its callback not run yet: it serves no more asks)
            self._sender = asyncio.create_task(self._send_cluster_wide())
            self._tasks.add(self._sender)
            self._sender.add_done_callback(self._sender_done)

    def _sender_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if self._sender is task:
            self._sender = None
        if not task.cancelled() and task.exception() is not None:
            log.warning("the scheduler nudge stopped: %s", task.exception())

    async def _send_cluster_wide(self) -> None:
        """First patches while asks come (shared/domain/nudge.py next_first, served), then one follow-up
        `follow_up` after the last of them unless another ask comes first (first patches again, then the
        follow-up after those)."""
        loop = asyncio.get_running_loop()
        last_first: float | None = None
        patched = ""
        while True:
            while self._earliest is not None:
                wait = next_first(self._earliest, last_first, self.interval) - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                    continue  # (asks came meanwhile: the earliest stays, the next patch is not later)
                self._asked.clear()
                last_first = loop.time()
                patched = await self._patch_any("first") or patched
                self._earliest = None if served(self._latest, last_first, self.interval) else self._latest
            if self.follow_up <= 0 or not patched:
                return
            try:
                await within(self._asked.wait(), self.follow_up)
                continue  # asked again: its first patch, and a follow-up after that
            except TimeoutError:
                pass
            await self._patch_any("follow_up")
            if self._earliest is None:
                return

    async def _patch_any(self, which: str) -> str:
        """Patch the Node asked last, or the one before it if that one is gone, ..., then up to KNOWN_TRIES of
        `known_nodes`; the Node patched, or "". The Nodes asked stay candidates (one asked while this patch was in
        flight needs a patch of its own, which may have to go elsewhere); those gone leave."""
        tried: set[str] = set()
        for node in [*reversed(list(self._recent)), *itertools.islice(self.known_nodes(), KNOWN_TRIES)]:
            if node in tried:
                continue
            tried.add(node)
            if await self._patch(node, which) != "gone":
                return node
            self._recent.pop(node, None)
        return ""

    async def _patch(self, node: str, which: str) -> str:
        if not self.someone_waits():
            self._count(which, "idle")
            return "idle"
        body = {"metadata": {"annotations": {FREED_ANNOTATION: str(int(time.time() * 1000))}}}
        try:
            await self.kube.request("PATCH", f"/api/v1/nodes/{node}", body,
                                    content_type="application/merge-patch+json")
            self._count(which, "sent")
            return "sent"
        except KubeError as e:
            if e.status == 404:  # the node went meanwhile: nothing to retry there
                self._count(which, "gone")
                return "gone"
            self._count(which, "error")
            # 403: the watcher's RBAC lacks `patch nodes`, and freed capacity is noticed only minutes later
            (log.warning if e.status in (401, 403) else log.debug)("could not nudge the scheduler about %s: %s",
                                                                   node, e)
        except Exception as e:
            self._count(which, "error")
            log.debug("could not nudge the scheduler about %s: %s", node, e)
        return "error"

    def _count(self, which: str, result: str) -> None:
        NUDGES.labels(which, result).inc()
        self.outcomes[which, result] = self.outcomes.get((which, result), 0) + 1
