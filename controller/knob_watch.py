"""Loud when a card's sgpu_km knobs change under held slices (part of the watcher).

The vendor module refuses a change of `max_inst`, `policy` or `time_slice` while a container holds
an allocation on the card, so a published change on such a card means the node and its running
pods disagree (a module reload, a ClusterConfig change the operator expects to apply, a hand-edited
annotation). The node watcher calls `observe` with every Node it sees; a change on a held card is
a Warning event on the Node (reason `CardKnobsChangedWhileHeld`; at most one a minute per node, naming the first
change and how many more), a log line and `mtsched_card_knob_changes_held_total{knob}` for each. A card's last
published knobs are the baseline while the card stays on the node, also through readings where it is unreadable
or the annotation is gone. Scheduling follows the new value at once (a lower `max_inst` refuses new slices;
nothing running is touched); any rise of a card's slice limit, whatever sets it, nudges kube-scheduler.

Several watcher replicas see the same change: the event's name is derived from the Node's
resourceVersion and the change, so the API server keeps one (the others get 409). The baseline is
what this replica saw last: a change made while every watcher was down is not reported.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from prometheus_client import Counter

from controller.mismatch import EVENT_EVERY_SECONDS
from shared.domain.annotations import PodUsage
from shared.domain.knobs import CardKnobs, KnobChange, held_changes
from shared.domain.node import Inventory
from shared.kube import Kube, KubeError

log = logging.getLogger("mtsched.knobs")

REASON = "CardKnobsChangedWhileHeld"
EVENT_NAMESPACE = "default"  # where the events of cluster-scoped objects (Nodes) live
HELD_CHANGES = Counter("mtsched_card_knob_changes_held_total",
                       "Changes of a card's max_inst/policy/time_slice published while the card held slices "
                       "(the vendor module refuses them; should stay 0)", ["knob"])


def event_body(node: Mapping[str, Any], change: KnobChange, component: str, more: int = 0) -> dict[str, Any]:
    meta = node.get("metadata") or {}
    name = str(meta.get("name", ""))
    key = f"{name}/{meta.get('resourceVersion', '')}/{change.card}/{change.knob}/{change.old}/{change.new}"
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{name[:200]}.knobs-{hashlib.sha256(key.encode()).hexdigest()[:16]}",
                     "namespace": EVENT_NAMESPACE},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": name, "uid": meta.get("uid")},
        "reason": REASON, "type": "Warning",
        "message": (change.message(name)[:900] + (f" (and {more} more change(s) of knobs on held cards of this node: "
                                                  "the watchers' log)" if more else "")),
        "source": {"component": component}, "reportingComponent": component,
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    }


class KnobWatch:
    def __init__(self, kube: Kube, events: bool = True, component: str = "hami-scheduler",
                 clock: Callable[[], float] = time.monotonic):
        self.kube = kube
        self.events = events
        self.component = component
        self.clock = clock
        # node -> each card's last published knobs, kept while the card stays on the node (also while it is
        # unreadable or the annotation is gone: a change made through such a state is still a change)
        self.last: dict[str, dict[int, CardKnobs]] = {}
        self.limits: dict[str, dict[int, int]] = {}  # node -> each card's slice limit when last seen
        self._event_at: dict[str, float] = {}  # node -> when its last event was sent (at most one a minute)
        self._posting: set[asyncio.Task[None]] = set()

    def forget(self, node: str) -> None:
        self.last.pop(node, None)
        self.limits.pop(node, None)
        self._event_at.pop(node, None)

    def keep_only(self, nodes: set[str]) -> None:
        """After a re-list: forget the nodes that vanished while the watch was down (a node of that name
        created later starts a new baseline, never a change against the old node's knobs)."""
        for node in (set(self.last) | set(self.limits)) - nodes:
            self.forget(node)

    async def observe(self, node: Mapping[str, Any], inv: Inventory,
                      holders: Callable[[], Mapping[str, tuple[PodUsage, str]]]) -> tuple[list[KnobChange], bool]:
        """Compare the node's published knobs with the last ones seen; report changes on held cards.
        Returns them, and whether a card's max_inst rose (pods the extender turned away may fit now: the
        caller nudges kube-scheduler once the ledger has the new limit). `holders` (pods holding cards on
        the node) is asked only when a knob changed: node events are frequent, knob changes rare."""
        if inv.error or not inv.cards:
            return [], False  # nothing to compare now: keep the last reading for when the node is readable
        # the slice limit in force, whatever it comes from (the card's knob, the node's label, the cluster's
        # default): a rise from any of them may fit pods the extender turned away (red team: the annotation
        # deleted, or first published above the node's label, nudged nobody)
        limits = {c.index: c.max_slices for c in inv.cards}
        was = self.limits.get(inv.node)
        self.limits[inv.node] = limits
        raised = was is not None and any(limits[i] > was[i] for i in set(limits) & set(was))
        old = self.last.get(inv.node)
        new = {i: k for i, k in (old or {}).items() if i in limits}  # (kept while the card is on the node)
        new.update((c.index, c.knobs) for c in inv.cards if c.knobs is not None)
        self.last[inv.node] = new
        if old is None or all(old[i] == new[i] for i in set(old) & set(new)):
            return [], raised
        held: dict[int, list[str]] = {}
        for usage, ref in holders().values():
            for idx in usage.cards:
                held.setdefault(idx, []).append(ref)
        changes = held_changes(old, new, held)
        for change in changes:
            HELD_CHANGES.labels(change.knob).inc()
            log.warning("node %s: %s", inv.node, change.message(inv.node))
        if changes and self.events:
            now = self.clock()
            if now - self._event_at.get(inv.node, -EVENT_EVERY_SECONDS) >= EVENT_EVERY_SECONDS:
                # one event a minute per node, the first change named (a node flipping its knobs posted one per
                # flip, knob and card: red team), sent beside the node stream, not in it
                self._event_at[inv.node] = now
                more = len(changes) - 1
                task = asyncio.ensure_future(self._event(node, changes[0], more))
                self._posting.add(task)
                task.add_done_callback(self._posting.discard)
        return changes, raised

    async def flush(self) -> None:
        """Until the events sent so far have been answered (tests; a stop cancels them)."""
        await asyncio.gather(*self._posting, return_exceptions=True)

    async def _event(self, node: Mapping[str, Any], change: KnobChange, more: int = 0) -> None:
        try:
            await self.kube.request("POST", f"/api/v1/namespaces/{EVENT_NAMESPACE}/events",
                                    event_body(node, change, self.component, more))
        except KubeError as e:
            if e.status != 409:  # 409: another replica reported this very change
                log.warning("could not record the %s event: %s", REASON, e)
        except Exception as e:
            log.warning("could not record the %s event: %s", REASON, e)
