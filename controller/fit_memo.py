"""The extender's memo of fit() answers and node scores, so a filter over hundreds of nodes computes
only what changed since the last pod.

Per node, an answer is valid while the mirror holds the same snapshot with the same cards dict: the
mirror never edits a cards dict in place (every change installs a new dict or a new snapshot), so two
identity checks tell whether anything fit() reads may have changed. Between two pods only the nodes
booked meanwhile change. Across nodes, nodes whose cards hold the same (often: nothing yet) share an
answer, so a request shape seen for the first time costs one fit() per distinct card state, not per
node. Bounded by bytes: past `max_bytes` every memo is dropped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shared.domain.fit import GPU_POLICY, NOUSE_UUID, USE_UUID, FitResult, extender_priority, fit
from shared.domain.request import SliceRequest
from shared.store.mirror import Mirror
from shared.store.state import CardRecord, NodeSnapshot

NODE_ANSWERS = 64  # answers kept per node (a node's memo is emptied when full)


def request_size(req: SliceRequest | None) -> int:
    """Approximate bytes a request keeps alive."""
    return 0 if req is None else 200 + sum(120 + len(s.name) for s in req.shares)


class FitMemo:
    def __init__(self, mirror: Mirror, max_bytes: int):
        self.mirror = mirror  # entries exist only for nodes of the mirror (pruned to them)
        self.max_bytes = max_bytes
        # node -> (snapshot, its cards dict, {key id: answer; -1: content id})
        self.fits: dict[str, tuple[NodeSnapshot, dict[int, CardRecord], dict[int, Any]]] = {}
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
        """The node's memo, new when the mirror's snapshot or its cards dict is not the one memoized."""
        entry = self.fits.get(name)
        if entry is None or entry[0] is not snap or entry[1] is not snap.cards:
            if entry is None and len(self.fits) > 2 * len(self.mirror.nodes) + 64:
                self.fits = {n: e for n, e in self.fits.items() if n in self.mirror.nodes}
            entry = self.fits[name] = (snap, snap.cards, {})
        return entry[2]

    def fit_nodes(self, names: Sequence[str], req: SliceRequest, annotations: Mapping[str, str],
                  gpu_policy: str) -> tuple[list[str], dict[str, str], dict[str, str]]:
        """(nodes that fit, failed node -> reason, unresolvable node -> reason) for one pod."""
        ok: list[str] = []
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        # everything fit() reads besides the card states
        key = self.key(("fit", req, annotations.get(USE_UUID), annotations.get(NOUSE_UUID),
                        annotations.get(GPU_POLICY), gpu_policy))
        share = not (annotations.get(USE_UUID) or annotations.get(NOUSE_UUID))
        get, fits, memo_of = self.mirror.get, self.fits, self.node  # hot loop: hundreds of nodes per call
        for name in names:
            snap = get(name)
            if snap is None:
                unresolvable[name] = "node unregistered"
            elif snap.error:
                unresolvable[name] = f"node unregistered: {snap.error}"
            else:
                entry = fits.get(name)
                memo = entry[2] if entry is not None and entry[0] is snap and entry[1] is snap.cards \
                    else memo_of(name, snap)
                result: FitResult | None = memo.get(key)
                if result is None:
                    if len(memo) >= NODE_ANSWERS:
                        memo.clear()
                    if share:
                        shared_key = (self.content(snap, memo), key)
                        result = self.shared.get(shared_key)
                        if result is None:
                            result = self.shared[shared_key] = fit(snap.states(), req, annotations, gpu_policy)
                            self.bytes += 150 + len(result.reason)
                    else:
                        result = fit(snap.states(), req, annotations, gpu_policy)
                    memo[key] = result
                if result.cards:  # result.ok
                    ok.append(name)
                else:
                    failed[name] = result.reason
        return ok, failed, unresolvable

    def scores(self, names: Sequence[str], policy: str) -> list[dict[str, Any]]:
        """HostPriorityList entries of the nodes under the node policy (0 for a node the mirror lacks)."""
        key = self.key(("priority", policy))
        out = []
        get, fits, memo_of = self.mirror.get, self.fits, self.node
        for name in names:
            snap = get(name)
            score = 0
            if snap:
                entry = fits.get(name)
                memo = entry[2] if entry is not None and entry[0] is snap and entry[1] is snap.cards \
                    else memo_of(name, snap)
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
