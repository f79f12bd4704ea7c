"""Mismatches are loud: a node that reports sliced cards but offers none because its capacity, its
`mthreads.com/sgpu.cores` label or its card model disagrees with the configuration (an S5000 under
`memoryPerCard: [96]`) stays closed (fail closed, shared/domain/node.py), and is made visible where an
operator looks: a Warning event on the Node once per distinct problem (at most one a minute per node; a problem
held back by that limit is reported when the minute ends, if it still holds), the gauge
`mtsched_node_mismatch{reason}`, and one summary line in the log after the first list. (The admission
warning is shared/domain/admission.py's; `mtsched explain` shows the node's problem too.)

The event's name is derived from the node's uid and the problem, so several watcher replicas, or a
restarted one, report a problem once: the API server refuses the same name twice (409) until the
event expires (the API server's event TTL, one hour by default).

A node the device plugin reports unhealthy devices on (allocatable below capacity, not covered by cordoned cards)
also offers no card. That is no configuration mismatch, but an operator must see it the same ways: the gauge
`mtsched_nodes_devices_unhealthy`, a `NodeDevicesUnhealthy` Warning event (the same limits, counted apart from the
mismatch events: a node whose mismatch turns into unhealthy devices within the minute reports both), and the alert
MtschedNodeDevicesUnhealthy.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from prometheus_client import Gauge

from shared.config import Config
from shared.domain.node import MISMATCH_KINDS, Inventory, mismatch_causes
from shared.domain.shapes import listed
from shared.kube import Kube, KubeError

log = logging.getLogger("mtsched.watchers")

NODE_MISMATCH = Gauge("mtsched_node_mismatch",
                      "Nodes that report sliced cards but offer none: capacity, sgpu.cores label or card model "
                      "disagree with the configuration, or a card annotation cannot be read (should stay 0)",
                      ["reason"])
NODES_UNHEALTHY = Gauge("mtsched_nodes_devices_unhealthy",
                        "Nodes that offer no sliced card because the device plugin reports devices unhealthy "
                        "(allocatable below capacity) on cards not cordoned")
EVENT_REASON = "NodeCardMismatch"
UNHEALTHY_REASON = "NodeDevicesUnhealthy"
EVENT_NAMESPACE = "default"  # where events about cluster-scoped objects go (as the kubelet's node events)
# At most one event per node this often: an annotation's writer (the node agent's identity) may change its value
# as often as it likes, each value a problem of its own; the gauge and the log follow every change.
EVENT_EVERY_SECONDS = 60.0


def event_name(node: str, uid: str, kind: str, error: str) -> str:
    """`kind` "" (not a mismatch): the node's devices are unhealthy."""
    digest = hashlib.sha256(f"{uid}\0{kind}\0{error}".encode()).hexdigest()[:12]
    return f"{node[:200]}.mtsched-{'mismatch' if kind else 'unhealthy'}.{digest}"


def event_body(node: str, uid: str, kind: str, error: str, component: str) -> dict[str, Any]:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    what = f"{kind} mismatch" if kind else "devices unhealthy"
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": event_name(node, uid, kind, error), "namespace": EVENT_NAMESPACE},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid},
        "reason": EVENT_REASON if kind else UNHEALTHY_REASON, "type": "Warning",
        "message": f"node offers no sliced card ({what}): {error}"[:1024],
        "source": {"component": component}, "reportingComponent": component,
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    }


class MismatchReporter:
    """The node watcher's view of mismatched nodes: node -> (kind, error), and of nodes closed by unhealthy
    devices: node -> error, with the gauges and events."""

    def __init__(self, kube: Kube | None, cfg: Config):
        self.kube = kube
        self.cfg = cfg
        self.problems: dict[str, tuple[str, str]] = {}
        self.unhealthy: dict[str, str] = {}
        # the uid of each node this reporter keeps something of (a problem, an event sent or owed): a Node of another
        # uid under that name (deleted and created again while the watch was down) is a new node
        self.uids: dict[str, str] = {}
        self.listed = False
        self.sent = 0
        self._tasks: set[asyncio.Task[None]] = set()
        # (node, mismatch or not) -> when its last event was sent (monotonic)
        self._event_at: dict[tuple[str, bool], float] = {}
        # an event the limit held back: the timer that sends the node's problem then (if it still holds), its uid
        self._owed: dict[tuple[str, bool], tuple[asyncio.TimerHandle, str]] = {}
        self._gauge()

    def _gauge(self) -> None:
        counts = dict.fromkeys(MISMATCH_KINDS, 0)
        for kind, _ in self.problems.values():
            counts[kind] = counts.get(kind, 0) + 1
        for kind, n in counts.items():
            NODE_MISMATCH.labels(kind).set(n)
        NODES_UNHEALTHY.set(len(self.unhealthy))

    def observe(self, name: str, node: Mapping[str, Any] | None, inv: Inventory | None) -> None:
        """One node as the API reports it (`inv` None: deleted). An event only when its problem changed."""
        uid = str(((node or {}).get("metadata") or {}).get("uid") or "")
        if inv is not None and uid and self.uids.get(name, uid) != uid:
            # another Node under that name: what was kept (and an event owed) was the old one's; its problem is
            # reported anew, for this one (was: the owed event named a uid that no longer exists, and the new Node
            # with the same problem got none)
            self._forget(name)
            self.problems.pop(name, None)
            self.unhealthy.pop(name, None)
        try:
            self._observe(name, node, inv)
        finally:
            if (name in self.problems or name in self.unhealthy or (name, True) in self._event_at
                    or (name, False) in self._event_at):
                if uid:
                    self.uids[name] = uid
            else:
                self.uids.pop(name, None)

    def _observe(self, name: str, node: Mapping[str, Any] | None, inv: Inventory | None) -> None:
        now = (inv.problem, inv.error) if inv is not None and inv.problem else None
        before = self.problems.get(name)
        if inv is None:  # deleted: nothing of it kept (a cluster whose nodes churn kept one entry per name ever)
            self._forget(name)
        sick = inv.error if inv is not None and inv.error and not inv.problem else ""
        if sick != self.unhealthy.get(name, ""):
            if sick:
                self.unhealthy[name] = sick
                if self.listed:  # (the first list's nodes: one summary line, synced)
                    log.warning("node %s offers no card: %s", name, sick)
                self._event(name, node, "", sick)
            else:
                self.unhealthy.pop(name)
                log.info("node %s: its devices are healthy again (or their cards cordoned)%s", name,
                         "" if inv is not None else ": deleted")
            self._gauge()
        if now is None:
            if before is not None:
                self.problems.pop(name)
                if inv is not None and inv.error:  # another reason closes it (devices reported unhealthy)
                    log.info("node %s: its mismatch is resolved (%s), but it still offers no card: %s", name,
                             before[1], inv.error)
                else:
                    log.info("node %s: its mismatch is resolved (%s)", name, before[1])
                self._gauge()
            return
        if before == now:
            return
        self.problems[name] = now
        self._gauge()
        self._event(name, node, *now)

    def _event(self, name: str, node: Mapping[str, Any] | None, kind: str, error: str) -> None:
        """A Warning event on the node, at most one per EVENT_EVERY_SECONDS per node and sort (mismatch or not).
        One held back is owed: sent when the limit allows, if the node still has that sort of problem (was: lost
        for good, the problem reported by no event however long it lasted)."""
        if self.kube is None or not self.cfg.events_enabled:
            return
        key = (name, bool(kind))
        uid = str(((node or {}).get("metadata") or {}).get("uid") or "")
        clock = time.monotonic()
        wait = self._event_at.get(key, clock - EVENT_EVERY_SECONDS) + EVENT_EVERY_SECONDS - clock
        owed = self._owed.pop(key, None)
        if owed is not None:
            owed[0].cancel()
        if wait > 0:
            self._owed[key] = (asyncio.get_running_loop().call_later(wait, self._due, key), uid)
            log.info("node %s: its problem changed again within %gs: its event follows in %.0fs if it lasts "
                     "(%s: %s)", name, EVENT_EVERY_SECONDS, wait, kind or "unhealthy", error)
            return
        self._event_at[key] = clock
        task = asyncio.create_task(self._send(name, uid, kind, error))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _due(self, key: tuple[str, bool]) -> None:
        """An owed event: the node's problem of that sort now, if it still has one."""
        owed = self._owed.pop(key, None)
        name, mismatch = key
        if owed is None:
            return
        if mismatch:
            if name in self.problems:
                self._event(name, {"metadata": {"uid": owed[1]}}, *self.problems[name])
        elif self.unhealthy.get(name):
            self._event(name, {"metadata": {"uid": owed[1]}}, "", self.unhealthy[name])

    def _forget(self, name: str) -> None:
        self.uids.pop(name, None)
        for key in ((name, True), (name, False)):
            self._event_at.pop(key, None)
            owed = self._owed.pop(key, None)
            if owed is not None:
                owed[0].cancel()

    def synced(self, names: set[str]) -> None:
        """After a (re-)list of `names`: forget nodes that are gone; after the first, one summary line."""
        for gone in set(self.problems) - names:
            self.problems.pop(gone)
        for gone in set(self.unhealthy) - names:
            self.unhealthy.pop(gone)
        for gone in set(self.uids) - names:
            self.uids.pop(gone)
        for gone in {name for name, _ in (*self._event_at, *self._owed)} - names:
            self._forget(gone)
        self._gauge()
        if not self.listed:
            self.listed = True
            if self.problems:
                log.warning("%d node(s) report sliced cards but offer none (their %s; memoryPerCard %s): %s",
                            len(self.problems), mismatch_causes(e for _, e in self.problems.values()),
                            [m.memory for m in self.cfg.models],
                            # (the first few: every node with its error was a line of 600 KB at 300 nodes)
                            listed([f"{n} ({k}: {e})" for n, (k, e) in sorted(self.problems.items())]))
            if self.unhealthy:
                log.warning("%d node(s) offer no card, their device plugin reporting devices unhealthy: %s",
                            len(self.unhealthy), ", ".join(sorted(self.unhealthy)[:20])
                            + (f" and {len(self.unhealthy) - 20} more" if len(self.unhealthy) > 20 else ""))

    async def _send(self, node: str, uid: str, kind: str, error: str) -> None:
        assert self.kube is not None
        try:
            await self.kube.request("POST", f"/api/v1/namespaces/{EVENT_NAMESPACE}/events",
                                    event_body(node, uid, kind, error, self.cfg.scheduler_name), best_effort=True)
            self.sent += 1
        except KubeError as e:
            if e.status != 409:  # 409: another replica (or this one before a restart) reported it already
                (log.warning if e.status in (401, 403) else log.debug)(
                    "could not record the event of node %s: %s", node, e)
        except Exception as e:
            log.debug("could not record the event of node %s: %s", node, e)
