"""Anti-entropy, the pure part: how one node's ledger differs from what the API server says.

The truth for a node is its inventory (from the Node object) and its holders: the live pods whose
allocation record books cards there. `diff_node` compares a ledger snapshot with that truth and
lists every difference; the reconciler (controller/reconciler.py) repairs a node that has any by one
atomic `replace_node`. Reservations newer than the keep window, and pending ones (a binder may be
mid-flight; the janitor expires them by TTL), are never called stale. A reservation that looks stale
is only a *suspect*: the shell confirms with the API server before it is dropped, since a lagging
watch could otherwise free a card a running pod holds. A record that differs from its pod's bound
reservation is no difference: only our bind books and marks bound, with the record it writes, so
the record changed since and the ledger's booking wins (`NodeDiff.kept`).
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from shared.domain.annotations import PodUsage
from shared.domain.node import Card, Inventory, offers_more
from shared.domain.request import SliceRequest
from shared.domain.state import NodeSnapshot, Reservation

K = TypeVar("K", bound=Hashable)

FUTURE_MS = 60_000  # as shared/store/lua/_lib.lua: a stamp later than now + this comes from a clock that jumped


@dataclass(frozen=True)
class Difference:
    kind: str  # node_missing, node_gone, node_error, unverified, card, usage, missing_holder, changed_holder,
    # unbound_holder
    detail: str


@dataclass(frozen=True)
class NodeDiff:
    node: str
    differences: tuple[Difference, ...] = ()
    suspects: tuple[str, ...] = ()  # uids booked here that no live holder accounts for (confirm first)
    remove: bool = False  # the API reports no sliced card here and nothing is held: drop the node
    # uids whose record differs from their bound reservation: the booking our bind made wins (it is no
    # difference to repair; a repair keeps it: replace_node keep_bound)
    kept: tuple[str, ...] = ()

    @property
    def clean(self) -> bool:
        return not self.differences and not self.suspects and not self.remove


def offers_cards(inv: Inventory | None) -> bool:
    """Whether the API server reports this node as one the ledger should hold (cards, or an error)."""
    return inv is not None and bool(inv.cards or inv.error)


def opens_up(before: NodeSnapshot | None, inv: Inventory) -> bool:
    """Whether writing `inv` over the ledger's `before` offers room `before` did not (node.py's offers_more, the one
    rule: open again after an error, a card new, healthy or uncordoned, more memory, cores or slices, e.g. a raised
    maxSlicesPerCard). Pods kube-scheduler parked against `before` may fit now, and no Node event says so (a
    configuration change is none). A node new to the ledger is not one: nothing was offered there to refuse against
    but `node unregistered`, which a lost ledger's rebuild answers for every node."""
    if before is None:
        return False
    was = tuple(Card(before.node, r.index, r.capacity, max_slices=r.slice_limit, cores=r.cores,
                     healthy=r.health in ("ok", "cordoned"), cordoned=r.health != "ok") for r in before.cards.values())
    return offers_more(Inventory(before.node, was, error=before.error), inv)


def _same(res: Reservation, usage: PodUsage) -> bool:
    return (res.cards == tuple(usage.cards) and res.mem == usage.memory and res.cores == usage.cores
            and res.slices == usage.slices)


@dataclass
class _Totals:
    mem: int = 0
    cores: int = 0
    slices: int = 0
    holders: list[str] = field(default_factory=list)


def settles(r: Reservation, now_ms: int, keep_from: int) -> bool:
    """Whether a reservation is still settling at `now_ms` (Redis's clock), so no view may judge it yet:
    pending (its binder may be mid-flight; the janitor expires it by TTL, whatever its stamps say: one stamped by
    a clock that stepped back since may hold a Binding in flight, `restamps`), or made or bound at or after
    `keep_from` (newer than the caller's truth). A bound stamp later than now + FUTURE_MS comes from a clock that
    jumped (a failover to a server behind) and settles nothing: it is judged now. The twin of `settles` in
    shared/store/lua/_lib.lua (tests/redis/test_settles_twin.py runs one table through both)."""
    if r.state == "pending":
        return True
    stamp = max(r.created, r.bound_at)
    if stamp > now_ms + FUTURE_MS:
        return False
    return stamp >= keep_from


def in_flight(r: Reservation, now_ms: int) -> bool:
    """Whether a bind attempt's Binding on this booking may still be committed at `now_ms` (`settle_by`); a
    stamp later than now + FUTURE_MS comes from a clock that jumped and holds nothing. The twin of _lib.lua's."""
    return r.settle_by >= now_ms and r.settle_by - now_ms <= FUTURE_MS


def restamps(r: Reservation, now_ms: int) -> bool:
    """Whether a pending reservation carries a stamp later than now + FUTURE_MS (`created`, or a bind attempt's
    `settle_by`): Redis's clock stepped back since (or a failover went to a server behind), its age cannot be
    told, and its Binding may be in flight. The janitor's expire stamps it anew at its `now` instead of releasing
    it, so it expires a TTL later (released at once, a step back of a minute freed a card a Binding in flight
    was about to take: red team, clocks). The twin of _lib.lua's."""
    return r.state == "pending" and (r.created - now_ms > FUTURE_MS or r.settle_by - now_ms > FUTURE_MS)


def expires(r: Reservation, now_ms: int, ttl_ms: int) -> bool:
    """Whether the janitor releases a reservation at `now_ms` (Redis's clock): pending past its TTL (its binder
    died or gave up), no stamp from a clock that stepped back since (`restamps`: its age cannot be told), and
    no bind attempt's Binding may still come (in_flight). The twin of expire.lua's test
    (tests/redis/test_expires_twin.py runs one table through both)."""
    return (r.state == "pending" and not restamps(r, now_ms) and not in_flight(r, now_ms)
            and now_ms - r.created > ttl_ms)


def pending_since(ages: Mapping[K, int], before: Mapping[K, float], clock: float, first: bool) -> dict[K, float]:
    """When the janitor's own monotonic `clock` dates each pending booking (`ages`: booking -> its age on Redis's
    clock, ms): as `before` if seen before, else now; at the janitor's first sweep, now minus that age (it has
    nothing else to date them by). A booking is expired only once both clocks say it is past the TTL: a step
    forward of Redis's clock (an NTP step, a failover to a server ahead) ages every booking on Redis's clock at
    once, bookings whose Binding is in flight too (red team, clocks); the host's monotonic clock does not step.
    The janitor keys a booking by its node, uid and Redis stamp (`booking_key`), never by uid alone: a pod's new
    booking (on another node, after its binder left the first) inherited the old one's date, and a step freed
    the card its Binding was about to take (red team, today's changes)."""
    return {u: before[u] if u in before else clock - (max(0, age) / 1000 if first else 0.0)
            for u, age in ages.items()}


def booking_key(node: str, r: Reservation) -> tuple[str, str, int, int]:
    """What `pending_since` dates: one booking as Redis last stamped it (a pod's on another node, one booked anew,
    or one a later bind attempt took over, with its settle_by, is another one)."""
    return node, r.uid, r.created, r.settle_by


def diff_node(node: str, snap: NodeSnapshot | None, inv: Inventory | None, holders: Mapping[str, PodUsage],
              now_ms: int, keep_ms: int, elsewhere: Collection[str] = ()) -> NodeDiff:
    """Every way `snap` (the ledger) differs from the truth (`inv`, `holders`), on Redis's clock `now_ms`.
    A quarantine (quarantine_reason) arrives as `inv.error`. `elsewhere`: pods the view holds on another node;
    a pending booking of one here, older than the keep window, is a suspect too (a pod binds once: its binder
    died before the Binding and the pod was bound elsewhere since; the janitor would free it only after its
    TTL)."""
    diffs: list[Difference] = []
    suspects: list[str] = []
    kept: list[str] = []
    if snap is None:
        if offers_cards(inv) or holders:
            diffs.append(Difference("node_missing", f"the ledger lacks node {node}"
                                    + (f" held by {len(holders)} pod(s)" if holders else "")))
        return NodeDiff(node, tuple(diffs))

    def settling(r: Reservation) -> bool:
        return settles(r, now_ms, now_ms - keep_ms)

    if not offers_cards(inv) and not holders and all(not settling(r) for r in snap.reservations.values()):
        return NodeDiff(node, (), (), remove=True)
    if not snap.verified:
        # Redis restarted or failed over since the last comparison: whatever else differs, the node is written
        # from the truth again, which also lets the reserve script book there again (replace_node)
        diffs.append(Difference("unverified", "not compared with the API server since Redis restarted or "
                                "failed over"))
    want_error = inv.error if inv is not None else ""
    if snap.error != want_error:
        diffs.append(Difference("node_error", f"error {snap.error!r}, the API implies {want_error!r}"))
    want = {c.index: c for c in (inv.cards if inv is not None else ())}
    for idx, c in want.items():
        rec = snap.cards.get(idx)
        health = c.health
        if rec is None:
            diffs.append(Difference("card", f"card {idx} missing"))
        elif (rec.capacity, rec.slice_limit, rec.health, rec.cores) != (c.capacity, c.max_slices, health, c.cores):
            diffs.append(Difference("card", f"card {idx} is capacity {rec.capacity}, slice_limit {rec.slice_limit}, "
                                    f"{rec.health}, {rec.cores} cores; the node reports {c.capacity}, "
                                    f"{c.max_slices}, {health}, {c.cores}"))
        elif rec.knobs != c.knobs:  # shown only, but the card table must not show stale knobs
            diffs.append(Difference("card", f"card {idx} shows knobs {rec.knobs}; the node publishes {c.knobs}"))
    totals: dict[int, _Totals] = {}
    for uid, r in snap.reservations.items():
        for idx in r.cards:
            t = totals.setdefault(idx, _Totals())
            t.mem += r.mem
            t.cores += r.cores
            t.slices += r.slices
            t.holders.append(uid)
    for idx, rec in snap.cards.items():
        if idx not in want and rec.health != "removed":
            diffs.append(Difference("card", f"card {idx} ({rec.health}) is not reported by the node"))
        t = totals.get(idx, _Totals())
        if (rec.mem_used, rec.cores_used, rec.slices) != (t.mem, t.cores, t.slices) or \
                rec.mem_free != max(0, rec.capacity - rec.mem_used) or \
                rec.cores_free != max(0, rec.cores - rec.cores_used):
            diffs.append(Difference("usage", f"card {idx} books {rec.mem_used} units/{rec.cores_used} cores/"
                                    f"{rec.slices} slices (free {rec.mem_free}/{rec.cores_free}); its "
                                    f"reservations add up to {t.mem}/{t.cores}/{t.slices}"))
    for idx in totals.keys() - snap.cards.keys():
        diffs.append(Difference("usage", f"reservations book card {idx}, which the ledger lacks"))
    for uid, usage in sorted(holders.items()):
        held = snap.reservations.get(uid)
        if held is None:
            diffs.append(Difference("missing_holder", f"pod {uid} holds cards {list(usage.cards)} "
                                    f"({usage.memory} units, {usage.cores} cores) without a reservation"))
        elif not _same(held, usage) and held.state == "bound":
            # only our bind books and marks bound, with the record it writes: a record that says otherwise
            # was changed since (whatever the reservation's age: a record never changes legitimately)
            kept.append(uid)
        elif not _same(held, usage):
            diffs.append(Difference("changed_holder", f"pod {uid} holds cards {list(usage.cards)} "
                                    f"({usage.memory}/{usage.cores}), the ledger books {list(held.cards)} "
                                    f"({held.mem}/{held.cores})"))
        elif held.state != "bound" and max(held.created, held.bound_at) < now_ms - keep_ms:
            # pending although the pod carries its record: the binder died before mark_bound, and the
            # janitor would soon expire a share a running pod holds
            diffs.append(Difference("unbound_holder", f"pod {uid} is bound, its reservation is {held.state}"))
    for uid, r in sorted(snap.reservations.items()):
        if uid in holders:
            continue
        # a pending one stamped ahead of Redis's clock (restamps) settles, as any pending one, but its age cannot
        # be told: asked about too (its pod gone, it is freed now, not a TTL after the janitor stamps it anew)
        if not settling(r) or (r.state == "pending" and (restamps(r, now_ms) or (
                uid in elsewhere and max(r.created, r.bound_at) < now_ms - keep_ms))):
            suspects.append(uid)
    return NodeDiff(node, tuple(diffs), tuple(suspects), kept=tuple(kept))


@dataclass(frozen=True)
class Unrecorded:
    """A live pod bound to a node and asking for slices whose record is missing or unreadable."""

    ref: str
    node: str
    request: SliceRequest | None  # None when even its request cannot be read
    gpu_index: str  # mthreads.com/gpu-index as the pod carries it ("" if absent)


def recovered_usage(u: Unrecorded, inv: Inventory | None) -> PodUsage | None:
    """What such a pod holds, from what survives on it: the cards of `mthreads.com/gpu-index` (written
    by our bind next to the record) and the amounts its request books on cards of their model. None
    when that cannot be told for sure."""
    if u.request is None or inv is None or not u.gpu_index:
        return None
    try:
        cards = tuple(sorted({int(x) for x in u.gpu_index.split(",")}))
    except ValueError:
        return None
    caps = {c.index: c.capacity for c in inv.cards}
    if len(cards) != u.request.cards or any(i not in caps for i in cards) or len({caps[i] for i in cards}) != 1:
        return None
    mem, cores, slices = u.request.booking_for(caps[cards[0]])
    return PodUsage(u.node, cards, mem, cores, slices)


def quarantine_reason(pods: Iterable[Unrecorded]) -> str:
    """The node error that keeps a node closed while pods hold cards there that nobody can account for
    (their usage is invisible, so any card could be over-committed): "" when there are none."""
    refs = sorted(u.ref for u in pods)
    if not refs:
        return ""
    more = f" and {len(refs) - 3} more" if len(refs) > 3 else ""
    return (f"quarantined: {', '.join(refs[:3])}{more} bound here asking for cards without a readable "
            "allocation record; no card is offered until they end")


def summarize(diffs: Iterable[Difference]) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in diffs:
        out[d.kind] = out.get(d.kind, 0) + 1
    return out
