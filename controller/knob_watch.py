"""Loud when a card's sgpu_km knobs change under held slices (part of the watcher).

The vendor module refuses a change of `max_inst`, `policy` or `time_slice` while a container holds
an allocation on the card, so a published change on such a card means the node and its running
pods disagree (a module reload, a ClusterConfig change the operator expects to apply, a hand-edited
annotation). The node watcher calls `observe` with every Node it sees; a change on a held card is
a Warning event on the Node (reason `CardKnobsChangedWhileHeld`) and a log line, at most one of each a minute per
node naming the first change and how many more (those within the minute after are reported when it ends), and
`mtsched_card_knob_changes_held_total{knob}` for each. A card's last
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
from collections.abc import Awaitable, Callable, Coroutine, Mapping
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


def more_changes(more: int) -> str:
    """What a log line or an event adds for the changes it stands for besides the one it names."""
    return f" (and {more} more change(s) of knobs on held cards of this node)" if more else ""


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
        "message": change.message(name)[:900] + more_changes(more),
        "source": {"component": component}, "reportingComponent": component,
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    }


class KnobWatch:
    def __init__(self, kube: Kube, events: bool = True, component: str = "hami-scheduler",
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep):
        self.kube = kube
        self.events = events
        self.component = component
        self.clock, self.sleep = clock, sleep
        # node -> each card's last published knobs, kept while the card stays on the node (also while it is
        # unreadable or the annotation is gone: a change made through such a state is still a change)
        self.last: dict[str, dict[int, CardKnobs]] = {}
        self.limits: dict[str, dict[int, int]] = {}  # node -> each card's slice limit when last seen
        self._event_at: dict[str, float] = {}  # node -> when its last event was sent (at most one a minute)
        # node -> (the first change held back, how many, the latest Node) until its minute ends (_after)
        self._held_back: dict[str, tuple[KnobChange, int, Mapping[str, Any]]] = {}
        self._later: set[str] = set()  # nodes whose held-back changes wait for the end of their minute
        self._closed: set[str] = set()  # nodes whose last reading offered no card (malformed, mismatched)
        self._posting: set[asyncio.Task[None]] = set()

    def forget(self, node: str) -> None:
        self.last.pop(node, None)
        self.limits.pop(node, None)
        self._event_at.pop(node, None)
        self._held_back.pop(node, None)
        self._closed.discard(node)

    def keep_only(self, nodes: set[str]) -> None:
        """After a re-list: forget the nodes that vanished while the watch was down (a node of that name
        created later starts a new baseline, never a change against the old node's knobs)."""
        for node in (set(self.last) | set(self.limits) | self._closed) - nodes:
            self.forget(node)

    async def observe(self, node: Mapping[str, Any], inv: Inventory,
                      holders: Callable[[], Mapping[str, tuple[PodUsage, str]]]) -> tuple[list[KnobChange], bool]:
        """Compare the node's published knobs with the last ones seen; report changes on held cards.
        Returns them, and whether a card's slice limit rose or the node offers cards again (pods the extender
        turned away may fit now: the caller nudges kube-scheduler once the ledger has it). `holders` (pods
        holding cards on the node) is asked only when a knob changed: node events are frequent, knob changes
        rare."""
        if inv.error or not inv.cards:
            self._closed.add(inv.node)  # offers no card now: its reopening may fit waiting pods
            return [], False  # nothing to compare now: keep the last reading for when the node is readable
        reopened = inv.node in self._closed
        self._closed.discard(inv.node)
        # the slice limit in force, whatever it comes from (the card's knob, the node's mtsched.io/max-inst
        # annotation, the cluster's default): a rise from any of them may fit pods the extender turned away (red
        # team: the knobs' annotation deleted, or first published above the node's max-inst, nudged nobody)
        limits = {c.index: c.max_slices for c in inv.cards}
        was = self.limits.get(inv.node)
        self.limits[inv.node] = limits
        # (a card the last reading lacked counts as a rise, and so does a node that offered no card)
        raised = reopened or (was is not None and any(limits[i] > was.get(i, 0) for i in limits))
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
        if changes:
            self._report(inv.node, node, changes)
        return changes, raised

    def _report(self, name: str, node: Mapping[str, Any], changes: list[KnobChange]) -> None:
        """One log line and one event a minute per node, naming the first change and how many more (a node
        flipping its knobs logged and posted one per flip, knob and card: red team); the changes made within the
        minute after are reported together when it ends. Events go beside the node stream, never in it."""
        now = self.clock()
        since = now - self._event_at.get(name, -EVENT_EVERY_SECONDS)
        if since >= EVENT_EVERY_SECONDS and name not in self._later:
            self._event_at[name] = now
            self._send(name, node, changes[0], len(changes) - 1)
            return
        first, count, _ = self._held_back.get(name, (changes[0], 0, node))
        self._held_back[name] = (first, count + len(changes), node)  # (the latest Node names the event)
        if name not in self._later:
            self._spawn(self._after(name, EVENT_EVERY_SECONDS - since))
            self._later.add(name)

    async def _after(self, name: str, delay: float) -> None:
        try:
            await self.sleep(max(0.0, delay))
        finally:
            self._later.discard(name)
        held = self._held_back.pop(name, None)
        if held is not None and name in self.last:  # (not for a node forgotten meanwhile)
            first, count, node = held
            self._event_at[name] = self.clock()
            self._send(name, node, first, count - 1)

    def _send(self, name: str, node: Mapping[str, Any], first: KnobChange, more: int) -> None:
        log.warning("node %s: %s%s", name, first.message(name), more_changes(more))
        if self.events:
            self._spawn(self._event(node, first, more))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._posting.add(task)
        task.add_done_callback(self._posting.discard)

    async def flush(self) -> None:
        """Until the events sent or held back so far are answered (tests; at a stop they end with the loop)."""
        while self._posting:
            await asyncio.gather(*self._posting, return_exceptions=True)

    async def _event(self, node: Mapping[str, Any], change: KnobChange, more: int = 0) -> None:
        try:
            await self.kube.request("POST", f"/api/v1/namespaces/{EVENT_NAMESPACE}/events",
                                    event_body(node, change, self.component, more), best_effort=True)
        except KubeError as e:
            if e.status != 409:  # 409: another replica reported this very change
                log.warning("could not record the %s event: %s", REASON, e)
        except Exception as e:
            log.warning("could not record the %s event: %s", REASON, e)
