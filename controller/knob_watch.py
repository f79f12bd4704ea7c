"""Loud when a card's sgpu_km knobs change under held slices (part of the watcher).

The vendor module refuses a change of `max_inst`, `policy` or `time_slice` while a container holds
an allocation on the card, so a published change on such a card means the node and its running
pods disagree (a module reload, a ClusterConfig change the operator expects to apply, a hand-edited
annotation). The node watcher calls `observe` with every Node it sees; a change on a held card is
a Warning event on the Node (reason `CardKnobsChangedWhileHeld`), a log line and
`mtsched_card_knob_changes_held_total{knob}`. Scheduling follows the new value at once (a lower
`max_inst` refuses new slices; nothing running is touched).

Several watcher replicas see the same change: the event's name is derived from the Node's
resourceVersion and the change, so the API server keeps one (the others get 409). The baseline is
what this replica saw last: a change made while every watcher was down is not reported.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from prometheus_client import Counter

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


def event_body(node: Mapping[str, Any], change: KnobChange, component: str) -> dict[str, Any]:
    meta = node.get("metadata") or {}
    name = str(meta.get("name", ""))
    key = f"{name}/{meta.get('resourceVersion', '')}/{change.card}/{change.knob}/{change.old}/{change.new}"
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{name[:200]}.knobs-{hashlib.sha256(key.encode()).hexdigest()[:16]}",
                     "namespace": EVENT_NAMESPACE},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": name, "uid": meta.get("uid")},
        "reason": REASON, "message": change.message(name)[:1024], "type": "Warning",
        "source": {"component": component}, "reportingComponent": component,
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    }


class KnobWatch:
    def __init__(self, kube: Kube, events: bool = True, component: str = "hami-scheduler"):
        self.kube = kube
        self.events = events
        self.component = component
        self.last: dict[str, dict[int, CardKnobs]] = {}  # node -> the knobs it published when last seen

    def forget(self, node: str) -> None:
        self.last.pop(node, None)

    def keep_only(self, nodes: set[str]) -> None:
        """After a re-list: forget the nodes that vanished while the watch was down (a node of that name
        created later starts a new baseline, never a change against the old node's knobs)."""
        for node in set(self.last) - nodes:
            del self.last[node]

    async def observe(self, node: Mapping[str, Any], inv: Inventory,
                      holders: Callable[[], Mapping[str, tuple[PodUsage, str]]]) -> tuple[list[KnobChange], bool]:
        """Compare the node's published knobs with the last ones seen; report changes on held cards.
        Returns them, and whether a card's max_inst rose (pods the extender turned away may fit now: the
        caller nudges kube-scheduler once the ledger has the new limit). `holders` (pods holding cards on
        the node) is asked only when a knob changed: node events are frequent, knob changes rare."""
        if inv.error or not inv.cards:
            return [], False  # nothing to compare now: keep the last reading for when the node is readable
        new = {c.index: c.knobs for c in inv.cards if c.knobs is not None}
        old = self.last.get(inv.node)
        self.last[inv.node] = new
        if old is None or all(old[i] == new[i] for i in set(old) & set(new)):
            return [], False
        raised = any(new[i].max_inst > old[i].max_inst for i in set(old) & set(new))
        held: dict[int, list[str]] = {}
        for usage, ref in holders().values():
            for idx in usage.cards:
                held.setdefault(idx, []).append(ref)
        changes = held_changes(old, new, held)
        for change in changes:
            HELD_CHANGES.labels(change.knob).inc()
            log.warning("node %s: %s", inv.node, change.message(inv.node))
            if self.events:
                await self._event(node, change)
        return changes, raised

    async def _event(self, node: Mapping[str, Any], change: KnobChange) -> None:
        try:
            await self.kube.request("POST", f"/api/v1/namespaces/{EVENT_NAMESPACE}/events",
                                    event_body(node, change, self.component))
        except KubeError as e:
            if e.status != 409:  # 409: another replica reported this very change
                log.warning("could not record the %s event: %s", REASON, e)
        except Exception as e:
            log.warning("could not record the %s event: %s", REASON, e)
