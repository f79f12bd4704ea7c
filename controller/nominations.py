"""Pods kube-scheduler nominated to a node after a preemption, until they bind: the extender's memory of them.

A preemptor is not bound when its victims go: kube-scheduler nominates it to one node
(`status.nominatedNodeName`) and schedules it again once they are deleted. Meanwhile its own filters count
it on that node for every pod of lower or equal priority, so those cannot take its room; the extender's cards
must do the same, or a lower-priority pod takes the card freed for it (or the preempt verb counts that card
for the next preemptor, whose victims then go for nothing: tests/e2e/test_redteam_preempt_nominated.py).

Learnt where the extender sees it: the preempt verb's answer (every node answered, as kube-scheduler picks one
of them), then each filter of a pod carrying `nominatedNodeName` (that node only). Followed on the API server
while it lives (InFlight.follow reads the pod; `followed` says what a read means): moved to the node the pod
names, seen again while it names one. Forgotten at its bind (on whatever node), when it is filtered with another
nomination or none, when a read finds the pod gone, bound, being deleted or (from the last of FOLLOW_AT_S on)
nominated nowhere, or NOMINATION_SECONDS after it was last seen (reads that failed). Bounded: at most MAX_NOMINATIONS
pods, the oldest forgotten first.
Per replica: kube-scheduler calls the extender beside it (the chart's sidecar), which sees both.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Collection, Container, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from shared.domain.preempt import Ahead
from shared.domain.request import SliceRequest
from shared.domain.views import part

NOMINATION_SECONDS = 120.0  # a nomination not seen again for this long is forgotten (kube-scheduler retries
# a nominated pod whenever one of its victims goes, and at least every podMaxBackoffSeconds, 10 s by default)
MAX_NOMINATIONS = 4096
# (node, pod) pairs and victims' uids kept in all: one preempt answer names up to every node, each with up to 1,024
# victims, so MAX_NOMINATIONS alone bounded nothing in bytes (1,000 preemptors answered on 500 nodes with 2
# victims each kept 164 MiB: red team). ~100 bytes each: ~26 MiB at most. Past it the oldest nominations are
# forgotten; a nomination that alone is past it keeps its nodes without their victims (its plan then leaves it
# any card there, so the next preemptor's victims must leave it one: fewer evictions, never more)
MAX_ENTRIES = 262_144
# A nominated pod is read this long after its nomination is learnt (the preempt verb's answer starts it afresh),
# then every FOLLOW_EVERY_S while the nomination lives (InFlight.follow): a preemptor deleted or bound by another
# replica meanwhile holds its cards that long at most, not NOMINATION_SECONDS
FOLLOW_AT_S = (1.0, 3.0, 10.0)
FOLLOW_EVERY_S = 10.0

Verdict = tuple[Literal["forget", "nominate", "wait"], str]


def read_times(first: tuple[float, ...], every: float) -> Iterator[float]:
    """When a followed pod is read, in seconds from the start of its follow: `first`, then every `every` after."""
    yield from first
    yield from itertools.count(first[-1] + every, every)


def followed(pod: Mapping[str, Any] | None, uid: str, settled: bool,
             answered: Collection[str] | None = None) -> Verdict:
    """What one read of a nominated pod (None: not found) says of its nomination. `forget`: the pod is gone, was
    made again under another uid, is bound, or is being deleted (kube-scheduler schedules no such pod); or it names
    no node although kube-scheduler has had time to write one (`settled`: from the last of FOLLOW_AT_S on;
    kube-scheduler did not nominate it, or cleared it, and its own filters no longer count it). `nominate`: it
    names this node now (moved there, seen again). `wait`: no node named yet, or, before `settled`, a node the
    preempt verb did not answer (`answered`): kube-scheduler's choice among them is not written yet, what the pod
    names is its nomination from before. Read again."""
    if pod is None:
        return "forget", ""
    meta, spec, status = (part(pod, k) for k in ("metadata", "spec", "status"))
    if meta.get("uid") != uid or spec.get("nodeName") or meta.get("deletionTimestamp"):
        return "forget", ""
    node = status.get("nominatedNodeName")
    if isinstance(node, str) and node and (settled or answered is None or node in answered):
        return "nominate", node
    return ("forget", "") if settled else ("wait", "")


@dataclass(frozen=True)
class Nomination:
    uid: str
    priority: int
    request: SliceRequest
    annotations: Mapping[str, str]
    victims: Mapping[str, tuple[str, ...]]  # node -> the victims answered there (its nodes: the keys)
    until: float  # monotonic

    def at(self, node: str) -> Ahead:
        """What a pod judged on `node` must leave room for: this pod, with its victims there."""
        return Ahead(self.uid, self.priority, self.request, self.annotations, self.victims.get(node, ()))


class Nominations:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.by_uid: dict[str, Nomination] = {}  # in the order they were last recorded (oldest first)
        self.by_node: dict[str, set[str]] = {}  # node -> uids nominated there
        self.entries = 0  # sum of size(): bounded by MAX_ENTRIES

    def __bool__(self) -> bool:
        return bool(self.by_uid)

    def record(self, uid: str, priority: int, req: SliceRequest, annotations: Mapping[str, str],
               nodes: Mapping[str, tuple[str, ...]] | Iterable[str]) -> set[str]:
        """`uid` is nominated to one of `nodes` now (node -> its victims there, as the preempt verb answered; or
        node names, the victims known from before kept); the nodes it was nominated to before and is not now."""
        before = self.by_uid.get(uid)
        left = self.forget(uid)
        victims = dict(nodes) if isinstance(nodes, Mapping) else {
            n: before.victims.get(n, ()) if before is not None else () for n in nodes}
        if not victims:
            return left
        if _size(victims) > MAX_ENTRIES:
            victims = dict.fromkeys(victims, ())
        got = self.by_uid[uid] = Nomination(uid, priority, req, dict(annotations), victims,
                                            self.clock() + NOMINATION_SECONDS)
        self.entries += _size(got.victims)
        for node in victims:
            self.by_node.setdefault(node, set()).add(uid)
        while len(self.by_uid) > MAX_NOMINATIONS or (self.entries > MAX_ENTRIES and len(self.by_uid) > 1):
            left |= self.forget(next(iter(self.by_uid)))
        return left - victims.keys()

    def forget(self, uid: str) -> set[str]:
        """Drop `uid`'s nomination (bound, or nominated no more); the nodes it held."""
        got = self.by_uid.pop(uid, None)
        if got is None:
            return set()
        self.entries -= _size(got.victims)
        for node in got.victims:
            uids = self.by_node.get(node)
            if uids is not None:
                uids.discard(uid)
                if not uids:
                    del self.by_node[node]
        return set(got.victims)

    def lapse(self) -> set[str]:
        """Forget the nominations not seen for NOMINATION_SECONDS; the nodes they held."""
        now = self.clock()
        nodes: set[str] = set()
        for uid in [u for u, n in self.by_uid.items() if n.until < now]:
            nodes |= self.forget(uid)
        return nodes

    def ahead_of(self, node: str, uid: str, priority: int, booked: Container[str] = ()) -> list[Nomination]:
        """The pods nominated to `node` that the pod `uid` of `priority` must leave room for, by uid: another pod,
        of a priority at least its own, with no booking there yet (`booked`: the node's reservations, and what is
        in flight there) and not lapsed. The one rule for the preempt verb, the filter, prioritize and bind."""
        uids = self.by_node.get(node)
        if not uids:
            return []
        now = self.clock()
        return [n for u in sorted(uids)
                if u != uid and u not in booked and (n := self.by_uid[u]).priority >= priority and n.until >= now]

def _size(victims: Mapping[str, tuple[str, ...]]) -> int:
    """A nomination's entries: its nodes and their victims."""
    return len(victims) + sum(len(v) for v in victims.values())
