"""The extender's memo of fit() answers and node scores, so a filter over hundreds of nodes computes
only what changed since the last pod.

Per node, answers are keyed by (node, seq): a mirror snapshot never changes, every change installs a new one
with the next seq (shared/domain/state.py), so an answer memoized at the seq the mirror holds is current. Each
node keeps the answers of its latest seq only. Between two pods only the nodes booked meanwhile change. Bind
takes filter's fit from here (`fitted`) instead of fitting again. Across nodes, nodes whose cards hold the
same (often: nothing yet) share an answer, so a request shape seen for the first time costs one fit() per
distinct card state, not per node. Bounded by bytes: past `max_bytes` every memo is dropped.

`held`: bookings this replica's bind is making right now (node -> uid -> (request, cards)), not yet in
the mirror. A node with one is fitted and scored on its cards with those bookings applied, never from
the memo, so a pod filtered while another pod's bind is in flight does not count that card as free.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from shared.domain.fit import (
    GPU_POLICY,
    NOUSE_UUID,
    USE_UUID,
    CardState,
    FitResult,
    Reasons,
    apply,
    extender_priority,
    fit,
    node_score,
)
from shared.domain.request import SliceRequest
from shared.domain.state import NodeSnapshot
from shared.store.mirror import Mirror

# a node the mirror cannot read while a live reshard moves its Redis Cluster slot (Mirror.moving): not offered
MOVING = "card state unreadable while its Redis Cluster slot moves between shards (offered again once read)"
NODE_ANSWERS = 64  # answers kept per node (a node's memo is emptied when full)
Held = Mapping[str, Mapping[str, tuple[SliceRequest, tuple[int, ...]]]]  # node -> uid -> (request, cards)
NO_HELD: Held = {}


class Planned(dict[str, tuple[SliceRequest, tuple[int, ...]]]):
    """A node's bookings as planned for the pods nominated there (controller/in_flight.py _held_for), made for
    one snapshot (`seq`) and never changed after: the card states, their fill and the fit answers on them are
    kept with it, so the filters that see the same plan compute them once (a plan per nominated node per
    filter cost 45 us a node: 10 preemptors answered on 500 nodes each made a filter of 5,000 nodes 80 times
    slower, red team)."""

    def __init__(self, seq: int, items: Mapping[str, tuple[SliceRequest, tuple[int, ...]]]):
        super().__init__(items)
        self.seq = seq
        self._states: list[CardState] | None = None
        self._fill: float | None = None
        self.fits: dict[int, FitResult] = {}

    def states_on(self, snap: NodeSnapshot) -> list[CardState]:
        if self.seq != snap.seq:
            return held_states(snap, self)
        if self._states is None:
            self._states = held_states(snap, self)
        return self._states

    def fill_on(self, snap: NodeSnapshot) -> float:
        if self.seq != snap.seq:
            return node_score(held_states(snap, self))
        if self._fill is None:
            self._fill = node_score(self.states_on(snap))
        return self._fill

    def fit_on(self, snap: NodeSnapshot, key: int, req: SliceRequest, annotations: Mapping[str, str],
               gpu_policy: str) -> FitResult:
        if self.seq != snap.seq:
            return fit(held_states(snap, self), req, annotations, gpu_policy)
        got = self.fits.get(key)
        if got is None:
            if len(self.fits) >= NODE_ANSWERS:
                self.fits.clear()
            got = self.fits[key] = fit(self.states_on(snap), req, annotations, gpu_policy)
        return got


def held_states(snap: NodeSnapshot, held: Mapping[str, tuple[SliceRequest, tuple[int, ...]]]) -> list[CardState]:
    """The node's cards with the in-flight bookings applied (those the snapshot already holds count once)."""
    states = list(snap.states())
    for uid, (req, cards) in held.items():
        if uid not in snap.reservations:
            states = apply(states, req, cards)
    return states


def request_size(req: SliceRequest | None) -> int:
    """Approximate bytes a request keeps alive."""
    return 0 if req is None else 200 + sum(120 + len(s.name) for s in req.shares)


class FitMemo:
    def __init__(self, mirror: Mirror, max_bytes: int):
        self.mirror = mirror  # entries exist only for nodes of the mirror (pruned to them)
        self.max_bytes = max_bytes
        # node -> (the snapshot's seq, {key id: answer; -1: content id}): answers keyed by (node, seq)
        self.fits: dict[str, tuple[int, dict[int, Any]]] = {}
        self.contents: dict[tuple[tuple[Any, ...], ...], int] = {}  # card states without the node -> id
        self.shared: dict[tuple[int, int], Any] = {}  # (content id, key id) -> FitResult or score
        self.keys: dict[tuple[Any, ...], int] = {}  # what a fit depends on -> small int (hashed once per call)
        self.bytes = 0  # approximate bytes of keys, contents and shared (annotation values included)

    def key(self, key: tuple[Any, ...]) -> int:
        """A small int for what a memoized answer depends on besides the cards. Call before a loop:
        it may reset every memo."""
        if self.bytes > self.max_bytes:
            self.keys.clear()  # ids are reused after this: forget every memo holding them
            self.fits.clear()
            self.contents.clear()
            self.shared.clear()
            self.bytes = 0
        k = self.keys.get(key)
        if k is None:
            k = self.keys[key] = len(self.keys)
            # keys hold annotation values (any length): counted by their size, not by their number
            self.bytes += 100 + sum(len(x) if isinstance(x, str) else
                                    request_size(x) if isinstance(x, SliceRequest) else 16 for x in key)
        return k

    def content(self, snap: NodeSnapshot, memo: dict[int, Any]) -> int:
        """Id of the node's card states less the node name (the only thing fit() reads of a card besides
        these fields is its device id, for the UUID annotations: pods with those skip sharing)."""
        cid: int | None = memo.get(-1)
        if cid is None:
            content = tuple((s.card.index, s.card.capacity, s.card.max_slices, s.card.healthy, s.card.cordoned,
                             s.card.cores, s.memory_used, s.cores_used, s.slices_used) for s in snap.states())
            cid = self.contents.get(content)
            if cid is None:
                cid = self.contents[content] = len(self.contents)
                self.bytes += 100 + 160 * len(content)
            memo[-1] = cid
        return cid

    def node(self, name: str, snap: NodeSnapshot) -> dict[int, Any]:
        """The node's memo at the snapshot's seq (a new one when the node changed since)."""
        entry = self.fits.get(name)
        if entry is None or entry[0] != snap.seq:
            if entry is None and len(self.fits) > 2 * len(self.mirror.nodes) + 64:
                self.fits = {n: e for n, e in self.fits.items() if n in self.mirror.nodes}
            entry = self.fits[name] = (snap.seq, {})
        return entry[1]

    def fit_key(self, req: SliceRequest, annotations: Mapping[str, str], gpu_policy: str) -> int:
        """The key of everything fit() reads besides the card states."""
        return self.key(("fit", req, annotations.get(USE_UUID), annotations.get(NOUSE_UUID),
                         annotations.get(GPU_POLICY), gpu_policy))

    def fitted(self, name: str, snap: NodeSnapshot, req: SliceRequest, annotations: Mapping[str, str],
               gpu_policy: str) -> FitResult | None:
        """Filter's fit of this request on this snapshot of the node, if memoized (bind reuses it)."""
        entry = self.fits.get(name)
        if entry is None or entry[0] != snap.seq:
            return None  # the node changed since filter (or filter ran elsewhere)
        result: FitResult | None = entry[1].get(self.fit_key(req, annotations, gpu_policy))
        return result

    def fit_nodes(self, names: Iterable[str], req: SliceRequest, annotations: Mapping[str, str],
                  gpu_policy: str, held: Held = NO_HELD,
                  limit: int = 0) -> tuple[list[str], dict[str, Reasons], dict[str, str]]:
        """(nodes that fit, failed node -> card reasons, unresolvable node -> reason) for one pod; with a
        `limit` > 0, fitting stops once that many nodes fit (the nodes after are in no result)."""
        ok: list[str] = []
        failed: dict[str, Reasons] = {}
        unresolvable: dict[str, str] = {}
        key = self.fit_key(req, annotations, gpu_policy)
        share = not (annotations.get(USE_UUID) or annotations.get(NOUSE_UUID))
        get, fits, memo_of = self.mirror.get, self.fits, self.node  # hot loop: hundreds of nodes per call
        moving = self.mirror.moving  # (empty but during a live reshard of a Redis Cluster)
        for name in names:
            snap = get(name)
            if moving and name in moving:
                unresolvable[name] = MOVING
            elif snap is None:
                unresolvable[name] = "node unregistered"
            elif snap.error:
                unresolvable[name] = f"node unregistered: {snap.error}"
            elif held and name in held:
                here = held[name]
                now = here.fit_on(snap, key, req, annotations, gpu_policy) if isinstance(here, Planned) else fit(
                    held_states(snap, here), req, annotations, gpu_policy)
                if now.cards:
                    ok.append(name)
                else:
                    failed[name] = now.reasons
            else:
                entry = fits.get(name)
                memo = entry[1] if entry is not None and entry[0] == snap.seq else memo_of(name, snap)
                result: FitResult | None = memo.get(key)
                if result is None:
                    if len(memo) >= NODE_ANSWERS:
                        memo.clear()
                    if share:
                        shared_key = (self.content(snap, memo), key)
                        result = self.shared.get(shared_key)
                        if result is None:
                            result = self.shared[shared_key] = fit(snap.states(), req, annotations, gpu_policy)
                            self.bytes += 150 + 60 * len(result.reasons.counts)
                    else:
                        result = fit(snap.states(), req, annotations, gpu_policy)
                    memo[key] = result
                if result.cards:  # result.ok
                    ok.append(name)
                else:
                    failed[name] = result.reasons
            if limit and len(ok) >= limit:
                break
        return ok, failed, unresolvable

    def scores(self, names: Sequence[str], policy: str, held: Held = NO_HELD) -> list[dict[str, Any]]:
        """HostPriorityList entries of the nodes under the node policy (0 for a node the mirror lacks)."""
        key = self.key(("priority", policy))
        out = []
        get, fits, memo_of = self.mirror.get, self.fits, self.node
        for name in names:
            snap = get(name)
            score = 0
            if snap and held and name in held:
                here = held[name]
                states = here.states_on(snap) if isinstance(here, Planned) else held_states(snap, here)
                score = extender_priority(states, policy)
            elif snap:
                entry = fits.get(name)
                memo = entry[1] if entry is not None and entry[0] == snap.seq else memo_of(name, snap)
                score = memo.get(key, -1)
                if score < 0:
                    if len(memo) >= NODE_ANSWERS:
                        memo.clear()
                    shared_key = (self.content(snap, memo), key)
                    score = self.shared.get(shared_key, -1)
                    if score < 0:
                        score = self.shared[shared_key] = extender_priority(snap.states(), policy)
                        self.bytes += 100
                    memo[key] = score
            out.append({"Host": name, "Score": int(score)})
        return out
