"""The Ledger: shared per-card state in Redis, changed only by atomic Lua scripts.

Every change is one script on one node's keys (one hash tag per node, so it also works on Redis
Cluster), idempotent by pod UID, with every key it touches in KEYS (shared/store/keys.py). Redis is
rebuildable state: the API server's pod annotations are the durable record, and `rebuild` recomputes
everything from them. Scripts live in shared/store/lua/ and are redis-py script objects: loaded once
and called by SHA (redis-py loads a script again after NOSCRIPT, e.g. when Redis restarted).
Key layout: docs/redis-layout.md.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import orjson
from redis import exceptions as rexc

from shared.domain.annotations import PodUsage
from shared.domain.fit import CardNeed, Plan, Reasons
from shared.domain.node import Inventory
from shared.domain.state import NodeSnapshot
from shared.serving.metrics import RELEASES
from shared.store.ledger_core import LedgerCore, LedgerError, log, now_ms
from shared.store.ledger_reads import HEADS_BATCH, SNAPSHOT_BATCH, LedgerReads, Reread
from shared.store.redis_conn import NO_OPTIONS, MasterReplaced, RedisOptions, connect, connect_subscriber, explain
from shared.store.resend import (
    RESEND,
    RESEND_OR_REDIRECT,
    ClosedUnderCommand,
    UnknownRedirect,
    resendable,
    slot_moving,
)
from shared.store.scripts import LUA_DIR, SCRIPTS, script_source, scripts_digest
from shared.store.server_checks import ServerChecks, slot_owners

# The plumbing (ledger_core.py), the reads of many nodes (ledger_reads.py), the server's checks
# (server_checks.py), the connection helpers (redis_conn.py), the resend rule (resend.py) and the scripts'
# sources (scripts.py) live apart; callers keep importing these names from here.
__all__ = ["HEADS_BATCH", "LUA_DIR", "NO_OPTIONS", "RESEND", "RESEND_OR_REDIRECT", "SCRIPTS", "SNAPSHOT_BATCH",
           "ClosedUnderCommand", "Ledger", "LedgerCore", "LedgerError", "RedisOptions", "Reread", "ReserveOutcome",
           "UnknownRedirect", "connect", "connect_subscriber", "explain", "now_ms", "resendable", "script_source",
           "scripts_digest", "slot_moving", "slot_owners"]

T = TypeVar("T")
# KEYS[1] deleted if it is of another type than a set (probed with SISMEMBER, a command the roles' ACL user has, as
# clear_damage in _lib.lua does): Ledger._cleared_node_list
CLEAR_NOT_SET = ("local r = redis.pcall('SISMEMBER', KEYS[1], '') "
                 "if type(r) == 'table' and r.err and string.find(r.err, 'WRONGTYPE', 1, true) then "
                 "return redis.call('DEL', KEYS[1]) end return 0")
# The reserve script's refusal on a node not compared with the API server since Redis's process changed
# (reserve.lua, `verified` in _lib.lua): replanning cannot help, the watchers' comparison does.
UNVERIFIED = "node unverified"
OTHER_AMOUNTS = "booked with other amounts"  # reserve.lua: the uid holds a booking of another size
# reserve.lua: ATTEMPTS_MAX (_lib.lua) attempts of the pod hold its booking, none given back yet
TOO_MANY_ATTEMPTS = "too many bind attempts"
ATTEMPTS_MAX = 16
NOTICES = ("wake", "verify")  # the feed's notices to the watchers (Ledger.notify)
MARK_BOUND_MAX = 512  # reservations per mark_bound call (mark_bound.lua checks the same bound)
# The longest keep window replace_node.lua and remove_node.lua take (keep_ms 0..86400000; more is BADINPUT)
KEEP_MS_MAX = 86_400_000


@dataclass(frozen=True)
class ReserveOutcome:
    """What a reservation came to: the booked cards and their capacity (0: not known, the booking is an
    earlier one on other cards than planned), or why not: the script's or the node's one reason
    (`refused`), or a plan's card counts (`reasons`)."""

    ok: bool
    cards: tuple[int, ...] = ()
    refused: str = ""
    existing: bool = False
    attempts: int = 1
    round_trips: int = 1
    capacity: int = 0
    reasons: Reasons | None = None
    # a new booking: the feed message the script published, for the caller's mirror (Mirror.apply) at once
    feed: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    # booked with a hold (reserve's hold_ms): until when (ms, Redis's clock) this attempt's Binding may be
    # committed (the janitor waits for it), this attempt's number among the pod's bind attempts on the
    # booking and its name (reserve.lua's `attempt`), which its give-back passes (Ledger.give_back). 0, "": no hold
    settle_by: int = 0
    bind_no: int = 0
    attempt: str = ""

    @property
    def reason(self) -> str:
        """Why not, as text (HAMi's "N/M Reason" for card counts): for bind errors and logs."""
        return self.reasons.text if self.reasons is not None else self.refused


class Ledger(LedgerReads, ServerChecks):
    """Bookings, releases, records and rebuilds: every change one script on one node's keys. Reads of many nodes
    (ledger_reads.py) and the server's checks (server_checks.py) are inherited."""

    # -- inventory -----------------------------------------------------------------------------

    @staticmethod
    def _cards_payload(inv: Inventory) -> dict[str, Any]:
        # the knobs besides max_inst (already the slice_limit) travel for display only: no rule reads them
        return {"error": inv.error, "cards": [
            {"index": c.index, "capacity": c.capacity, "slice_limit": c.max_slices, "health": c.health,
             **({"policy": c.knobs.policy, "time_slice": c.knobs.time_slice,
                 "overcommit_ratio": c.knobs.overcommit_ratio} if c.knobs else {})}
            for c in inv.cards]}

    async def upsert_node(self, inv: Inventory, create: bool = True) -> int:
        """Write a node's cards (keeping usage); returns the node's new version.

        With create=False a node missing from Redis is not created and -1 is returned: for a node we
        knew, that means Redis lost its data and only a rebuild (with the pods' usage) may recreate it.
        """
        payload = self._cards_payload(inv)
        payload["create"] = create
        added = 0
        if create:
            # Listed first: if this process dies between the two calls, a listed node without keys is
            # harmless (reads skip it), while node keys nobody lists would be invisible to mirrors and
            # never removed by a rebuild.
            added = await self.list_node(inv.node)
        try:
            version = int(await self._call("upsert_node", inv.node, payload, lambda k: self.keys.upsert_node(
                inv.node, (c.index for c in inv.cards), k)))
        except LedgerError:
            if added:  # refused input leaves no trace
                await self._unlist(inv.node)
            raise
        if version < 0:
            return version
        self._saw(inv.node, cards=(str(c.index) for c in inv.cards))  # (and those still held, known before)
        if not create:
            await self.list_node(inv.node)
        return version

    async def remove_node(self, node: str, keep_ms: int | None = None) -> bool | None:
        """Forget a node and everything booked on it; True if it existed. With `keep_ms`, a node where a
        reservation is still settling (pending, or made or bound in the `keep_ms` ms before this call) is left as it is
        and None is returned: its binder writes the Binding whatever the ledger says, so the caller keeps
        the booking (replace_node onto placeholder cards) instead of forgetting it."""
        started = time.monotonic()

        def body() -> dict[str, Any]:  # counted back from this call, also when sent again (as replace_node's)
            return {} if keep_ms is None else {"keep_ms": _keep_window(keep_ms, started)}

        out = int(await self._call("remove_node", node, body, lambda k: self.keys.remove_node(node, k)))
        if out < 0:
            return None
        self._known.pop(node, None)
        await self._unlist(node)
        return bool(out)

    async def announce(self, node: str) -> None:
        """Tell every mirror to re-read `node` (a `rebuild` notice on the feed; no state changes)."""
        msg = orjson.dumps({"node": node, "version": 0, "kind": "rebuild"}).decode()
        await self._publish(msg)

    async def notify(self, kind: str, node: str) -> None:
        """A notice to the watchers on the feed (no state changes; Mirror.on_notice), one of NOTICES:
        `wake`: nudge kube-scheduler about `node`, where cards an extender replica held for a bind that never
        came are free again and pods it turned away meanwhile wait for a cluster event;
        `verify`: compare `node` with the API server now, as a booking there was refused for want of it
        (UNVERIFIED). Version 0: a mirror that does not know the kind ignores it."""
        if kind not in NOTICES:
            raise ValueError(f"notice kind {kind!r}: allowed {', '.join(NOTICES)}")
        msg = orjson.dumps({"node": node, "version": 0, "kind": kind}).decode()
        await self._publish(msg)

    async def _publish(self, msg: str) -> None:
        """PUBLISH on the feed. Sent as a raw command: redis-py's asyncio cluster client has no `publish` method (on
        redis+cluster:// every notice failed with an AttributeError); a classic PUBLISH sent to any node of a
        cluster reaches the subscribers of every node."""
        def send() -> Awaitable[int]:
            return self.redis.execute_command("PUBLISH", self.feed, msg)  # type: ignore[no-untyped-call]

        await self._retry("publish", send)

    async def list_node(self, node: str) -> int:
        return await self._node_list("sadd", lambda: cast("Awaitable[int]", self.redis.sadd(self.nodes_key, node)))

    async def _unlist(self, node: str) -> None:
        await self._node_list("srem", lambda: cast("Awaitable[int]", self.redis.srem(self.nodes_key, node)))

    async def nodes(self) -> list[str]:
        return sorted(await self._node_list("smembers", lambda: cast("Awaitable[set[str]]",
                                                                     self.redis.smembers(self.nodes_key))))

    async def _node_list(self, what: str, op: Callable[[], Awaitable[T]]) -> T:
        """`op` on the node list, sent again once a node list of another type was cleared (_cleared_node_list)."""
        try:
            return await self._retry(what, op)
        except rexc.ResponseError as e:
            if not await self._cleared_node_list(e):
                raise
        return await self._retry(what, op)

    async def _cleared_node_list(self, e: rexc.ResponseError) -> bool:
        """Whether `e` said the node list is of another type than a set (nothing this code wrote: an edit behind its
        back), which is then deleted: it failed every read of it for ever, every mirror's resync and every
        reconciler's pass (their supervisors gave up: a crash loop). Read as empty then; the reconciler's next pass
        lists every node it reads again (tests/redis/test_redteam_wrongtype.py)."""
        if not str(e).startswith("WRONGTYPE"):
            return False
        log.error("%s is not a set (not written by mtsched: an edit behind its back?): deleted; the watchers list the "
                  "nodes again", self.nodes_key)
        # deleted only while it is not a set, in one step: a plain DEL sent after the WRONGTYPE deleted the set another
        # role had cleared and filled again meanwhile (tests/redis/test_redteam_node_list_clear_race.py)
        await self._retry("del", lambda: cast("Awaitable[int]", self.redis.eval(CLEAR_NOT_SET, 1, self.nodes_key)))
        return True

    # -- reservations --------------------------------------------------------------------------

    async def reserve(self, node: str, uid: str, cards: Sequence[int], mem: int, cores: int, slices: int,
                      model: int = 0, whole: bool = False, pod: str = "",
                      need: CardNeed | None = None, hold_ms: int = 0) -> tuple[ReserveOutcome, NodeSnapshot | None]:
        """Check-and-book on the given cards. On conflict returns the node's fresh state too: all its cards
        (or None, when the node has cards this ledger did not know of) and the reservations it knew of.
        `hold_ms` (a binder): its Binding may be committed until that long from now, so neither the janitor nor
        an earlier attempt's give-back releases the booking before (answered as `settle_by`). The call is named
        as one attempt (`attempt`, the same on every send of it): its give-back frees the booking only when no
        other attempt holds it, whichever order their commands ran in (release.lua).

        With `need` (a Plan's), the script checks every card with the twin of shared.domain.fit.card_rule on
        exactly those terms; `model`/`whole` are the short form (accepts {model}, require idle)."""
        payload: dict[str, Any] = {"uid": uid, "cards": list(cards), "mem": mem, "cores": cores, "slices": slices,
                                   "model": model, "whole": whole, "pod": pod}
        attempt = ""
        if hold_ms:
            attempt = secrets.token_hex(8)
            payload.update(hold_ms=hold_ms, attempt=attempt)
        if need is not None:
            payload.update(mem=need.memory, cores=need.cores, slices=need.slices, idle=need.require_idle,
                           deny=sorted(need.deny))
            if need.accepts is not None:
                payload["accepts"] = sorted(need.accepts)
        resent: list[BaseException] = []
        try:
            raw = await self._call("reserve", node, payload, lambda k: self.keys.reserve(node, uid, cards, k),
                                   resent=resent)
        except Exception as e:
            if attempt and _may_have_run([*resent, e]):
                await self._withdraw(node, uid, attempt)
            raise
        out = orjson.loads(raw)
        if out["ok"]:
            self._saw(node, uids=[uid])
            got = tuple(int(x) for x in str(out["cards"]).split(",") if x)
            feed = out.get("feed")
            return ReserveOutcome(True, got, existing=bool(out.get("existing")),
                                  feed=feed if isinstance(feed, dict) else None,
                                  settle_by=int(out.get("settle_by") or 0), bind_no=int(out.get("bind_no") or 0),
                                  attempt=attempt), None
        snap = NodeSnapshot.from_json(out["node"]) if out.get("node") else None
        return ReserveOutcome(False, refused=str(out.get("reason", ""))), snap

    async def _withdraw(self, node: str, uid: str, attempt: str) -> None:
        """A reserve with a hold that may have run, its replies lost until the resends ran out: its caller never learns
        the attempt's name and sends no Binding, so the name comes off the booking now if Redis answers one send,
        rather than keeping the booking from every later attempt's give-back until the janitor's expiry. Named only, no
        number: a booking that lists no attempt stays (release.lua). A command of it still in flight may list the name
        again: the janitor's expiry frees that one."""
        try:
            fate, _ = await self.give_back(node, uid, attempt=attempt, give_up=lambda _e: True)
        except Exception as e:  # Redis still away: the name stays, the booking waits for the janitor
            log.info("reserve on %s for %s: its outcome is unknown, and its attempt could not be withdrawn: %s",
                     node, uid, e)
        else:
            if fate == "released":
                RELEASES.labels("reserve_unanswered").inc()
            log.info("reserve on %s for %s: its outcome is unknown; its attempt withdrawn (booking %s)",
                     node, uid, fate)

    async def place(self, node: str, uid: str, plan: Plan, pod: str = "",
                    hold_ms: int = 0) -> tuple[ReserveOutcome, NodeSnapshot | None]:
        """Send a plan (shared.domain.fit.plan_booking: the caller plans) to the atomic reserve script.

        Booked: the cards with their capacity (the plan's, when the script booked the planned cards).
        Refused: the reason and the node's fresh state, so the caller can plan again without a read. The
        replanning loop is shared.store.placing.place.
        """
        need = plan.need
        if need is None:
            raise ValueError(f"place on {node} for {uid}: the plan has no booking ({plan.reason})")
        outcome, fresh = await self.reserve(node, uid, plan.cards, need.memory, need.cores, need.slices, pod=pod,
                                            need=need, hold_ms=hold_ms)
        if outcome.ok and outcome.cards == plan.cards:
            outcome = ReserveOutcome(True, outcome.cards, existing=outcome.existing, capacity=plan.capacity,
                                     feed=outcome.feed, settle_by=outcome.settle_by, bind_no=outcome.bind_no,
                                     attempt=outcome.attempt)
        return outcome, fresh

    async def mark_bound(self, node: str, uid: str) -> bool:
        """Mark one reservation bound; False when there is none."""
        return not await self.mark_bound_many(node, [uid])

    async def mark_bound_many(self, node: str, uids: Sequence[str]) -> list[str]:
        """Mark these reservations of one node bound, in one round trip and one feed message (at most
        MARK_BOUND_MAX at a time); returns those that have no reservation."""
        if not 0 < len(uids) <= MARK_BOUND_MAX:
            raise ValueError(f"mark_bound_many: {len(uids)} uids; allowed 1..{MARK_BOUND_MAX}")
        out = orjson.loads(await self._call("mark_bound", node, {"uids": list(uids)},
                                            lambda _k: self.keys.mark_bound(node, *uids)))
        missing = out.get("missing") or []  # Lua's cjson encodes an empty list as {}
        return [str(u) for u in missing] if isinstance(missing, list) else []

    async def release(self, node: str, uid: str, give_up: Callable[[BaseException], bool] | None = None,
                      ended: bool = False) -> bool:
        """Give a pod's share back; True if something was held. Idempotent. `give_up`: as in _retry. `ended`: the
        pod ended (deleted, Succeeded or Failed): its uid is tombstoned on the node in the same step, held or not, so
        no write read before it ended books it there again (shared/domain/ended.py)."""
        fate, _ = await self.give_back(node, uid, give_up=give_up, ended=ended)
        return fate == "released"

    async def release_feed(self, node: str, uid: str) -> tuple[bool, Mapping[str, Any] | None]:
        """As release, with the feed message the script published (None if nothing was held), for the
        caller's mirror (Mirror.apply) at once."""
        fate, feed = await self.give_back(node, uid)
        return fate == "released", feed

    async def give_back(self, node: str, uid: str, bind_no: int | None = None,
                        give_up: Callable[[BaseException], bool] | None = None,
                        attempt: str = "", ended: bool = False) -> tuple[str, Mapping[str, Any] | None]:
        """Release a pod's booking: "released" (with the feed message, as release_feed), "gone" (nothing
        held) or, with `bind_no` and/or `attempt` (a binder giving back its own booking: what its reserve answered;
        the name alone takes only that attempt off), "kept" when the pod's Binding is committed there or another bind
        attempt of the pod holds it (release.lua)."""
        body: dict[str, Any] = {"uid": uid}
        if bind_no is not None:
            body["if_bind_no"] = bind_no
        if attempt:
            body["if_attempt"] = attempt
        if ended:
            body["ended"] = True
        resent: list[BaseException] = []
        out = orjson.loads(await self._call("release", node, body,
                                            lambda k: self.keys.release(node, uid, k, ended), give_up, resent=resent))
        if out.get("kept"):
            return "kept", None
        self._saw(node, gone=[uid])
        feed = out.get("feed")
        if not out["released"] and _may_have_run(resent):
            # a send before may have released it, its reply lost: told "released" (without its feed message), so
            # the caller nudges the node (a nudge too many costs a node PATCH; one missing leaves the pods
            # kube-scheduler turned away for the card waiting for its next unschedulable flush, minutes)
            return "released", None
        return ("released" if out["released"] else "gone"), feed if isinstance(feed, dict) else None

    async def observe(self, uid: str, usage: PodUsage, pod: str = "", keep_bound: bool = False,
                      give_up: Callable[[BaseException], bool] | None = None) -> dict[str, Any]:
        """Record the allocation a bound pod carries (idempotent); reports over-commit instead of hiding it.

        A node missing from Redis is refused ({"ok": false, "reason": "node missing"}), never created.
        `keep_bound`: a bound reservation that differs from `usage` stays as it is, answered with
        {"kept": true, "booked": {cards, mem, cores, slices}} (the record changed after our bind).
        A pod tombstoned on the node (it ended, and its release came first: Ledger.release's `ended`) is not booked:
        {"ended": true}, nothing written.
        """
        out: dict[str, Any] = orjson.loads(await self._call("observe", usage.node, {
            "uid": uid, "cards": list(usage.cards), "mem": usage.memory, "cores": usage.cores,
            "slices": usage.slices, "pod": pod, "keep_bound": keep_bound},
            lambda k: self.keys.observe(usage.node, uid, usage.cards, k), give_up))
        return out

    async def expire(self, node: str, ttl_seconds: float, only: Iterable[str] | None = None) -> list[str]:
        """Release pending reservations older than the TTL on one node (with `only`: of those uids alone);
        returns their uids."""
        payload: dict[str, Any] = {"ttl_ms": int(ttl_seconds * 1000)}
        if only is not None:
            payload["uids"] = sorted(set(only))
            if not payload["uids"]:
                return []
        resent: list[BaseException] = []
        gone = [str(u) for u in orjson.loads(await self._call("expire", node, payload, resent=resent))]
        if only is not None and _may_have_run(resent):
            # a send before may have released some, its reply lost: those of `only` the node no longer holds are
            # answered too (released by it, or by another caller meanwhile), so the janitor nudges the node
            snap = await self.snapshot(node)
            held = snap.reservations if snap is not None else {}
            gone = sorted(set(gone) | {u for u in payload["uids"] if u not in held})
        self._saw(node, gone=gone)
        return gone

    # -- rebuild -------------------------------------------------------------------------------

    async def replace_node(self, inv: Inventory, bound: Mapping[str, tuple[PodUsage, str]],
                           keep_ms: int | None = None, keep_bound: bool = False,
                           keep_from: int | None = None, verify_after_ms: int | None = None,
                           lost: bool = False, truth_at: int | None = None) -> dict[str, Any]:
        """Atomically set one node to what the API implies: its cards and its bound pods' usage.

        Reservations still settling (pending, or made or bound in the `keep_ms` ms before this call, also when it is
        sent again after a lost reply, or
        since `keep_from`: newer than the caller's truth) are kept, whether or not they fit (their binder
        writes its Binding anyway); those on a card they leave over-full are counted in
        "pending_overfull". A pod of `bound` tombstoned on the node (it ended, and the pod watcher's release came
        first: shared/domain/ended.py) is not booked, and a reservation held for one is freed: "ended" lists those
        left out. `keep_bound`: a pod of `bound` whose
        reservation is bound keeps that booking where its record differs; their uids come back as
        "kept_bound" (a list). A reservation it writes anew keeps its last bind attempt's number, so an earlier
        attempt's give_back leaves it. "dropped": how many reservations it freed (of pods neither bound nor settling);
        "maybe_dropped": whether it freed some, or may have (a send whose reply was lost, then sent again).
        `verify_after_ms` (every writer in the roles; its truth is the API's): a node not verified under the
        history this Redis holds (its `run`, docs/redis-layout.md "Losing Redis") is verified by a truth read
        consistently from the API server at `truth_at` (Redis time, read before the read began), once that is
        `verify_after_ms` after a writer first found the node unverified; a truth without `truth_at` (a
        watch's view, which may lag) starts the window but verifies no such node. A node new to this Redis is
        verified at once, unless `lost` (its keys went with the state: the window starts now). "verified"
        says whether it is, "verify_in_ms" how long until a read may verify it, "was_unverified" whether the
        node existed unverified before this write (so a call answering both verified it, and no other call
        did: the script is atomic). None (a view that is not live): a new node is verified at once, an existing
        one is left as it is.
        """
        payload = self._cards_payload(inv)
        if keep_from is not None:
            payload["keep_from"] = max(0, int(keep_from))
        payload["keep_bound"] = keep_bound
        if verify_after_ms is not None:
            payload["verify_after_ms"] = max(0, int(verify_after_ms))
        if lost:
            payload["lost"] = True
        if truth_at is not None:
            payload["truth_at"] = max(0, int(truth_at))
        payload["bound"] = [
            {"uid": uid, "cards": list(u.cards), "mem": u.memory, "cores": u.cores, "slices": u.slices,
             "pod": pod}
            for uid, (u, pod) in sorted(bound.items())]
        named = [(uid, u.cards) for uid, (u, _pod) in bound.items()]
        resent: list[BaseException] = []
        started = time.monotonic()

        def body() -> dict[str, Any]:
            # keep_ms counts back from this call, not from a send: one sent again after its reply was lost (seconds
            # later) keeps what was made or bound since then too (the elapsed time is ours: fine for a duration)
            if keep_ms is not None:
                payload["keep_ms"] = _keep_window(keep_ms, started)
            return payload

        out: dict[str, Any] = orjson.loads(await self._call("replace_node", inv.node, body, lambda k: (
            self.keys.replace_node(inv.node, (c.index for c in inv.cards), named, k)), resent=resent))
        out["kept_bound"] = list(out.get("kept_bound") or [])  # cjson sends an empty list as {}
        out["ended"] = [str(u) for u in (out.get("ended") or [])]  # pods of `bound` left out: tombstoned, they ended
        # a first run whose reply was lost may have dropped reservations; the second finds nothing to drop. Its
        # caller must still tell kube-scheduler the cards may be free (rebuild's `freed`), or pods turned away
        # wait for an unrelated event
        out["maybe_dropped"] = bool(out.get("dropped")) or _may_have_run(resent)
        return out

    async def rebuild(self, inventories: Iterable[Inventory],
                      bound: Mapping[str, tuple[PodUsage, str]],
                      keep_ms: int | None = None, keep_bound: bool = False,
                      freed: Callable[[str], None] | None = None,
                      verify_after_ms: int | None = None, lost: bool = False,
                      truth_at: Mapping[str, int] | None = None) -> dict[str, int]:
        """Recompute the whole ledger from the API server's truth (nodes + bound pods' annotations).

        Node by node, each an atomic replace, so no replica ever reads a node empty or doubled;
        nodes that no longer exist are removed last, unless a pod still holds cards there.
        `keep_ms`: reservations made or bound in the keep_ms ms before this call are kept on every node, however long
        the rebuild takes to reach it (each node's write is sent keep_ms plus the time elapsed since).
        `keep_bound`: see replace_node (a rebuild over state Redis still has keeps what our bind booked).
        `freed` is called with each node whose replace dropped reservations (their cards are free again).
        `verify_after_ms`, `lost`, `truth_at` (by node: when the consistent read of the pods began): see
        replace_node (the watchers pass their keep window, so that a bind in flight when Redis's history changed
        is in their truth first, and `lost` after a state loss).
        "unverified" counts the nodes still waiting, "verified" the nodes this rebuild verified (replace_node's
        "was_unverified").
        """
        at = truth_at or {}
        started = time.monotonic()

        def keep() -> int | None:
            # keep_ms counts back from this call, not from each node's write: a rebuild over many nodes (or one slowed
            # by resends) reaches its last ones later than the window, where a booking bound after the caller's truth
            # was read, and not in it, would be dropped while its pod runs on the card
            return None if keep_ms is None else _keep_window(keep_ms, started)

        by_node: dict[str, dict[str, tuple[PodUsage, str]]] = {}
        for uid, (usage, pod) in bound.items():
            by_node.setdefault(usage.node, {})[uid] = (usage, pod)
        seen = set()
        stats = {"nodes": 0, "bound": 0, "pending_kept": 0, "pending_overfull": 0, "removed": 0, "kept_bound": 0,
                 "dropped": 0, "unverified": 0, "verified": 0}
        for inv in inventories:
            seen.add(inv.node)
            await self.list_node(inv.node)  # listed first, see upsert_node
            out = await self.replace_node(inv, by_node.get(inv.node, {}), keep(), keep_bound,
                                          verify_after_ms=verify_after_ms, lost=lost, truth_at=at.get(inv.node))
            _count_verified(stats, out)
            stats["dropped"] += int(out.get("dropped") or 0)
            if freed is not None and out["maybe_dropped"]:
                freed(inv.node)
            stats["nodes"] += 1
            stats["kept_bound"] += len(out["kept_bound"])
            stats["bound"] += int(out["bound"])
            stats["pending_kept"] += int(out["pending_kept"])
            stats["pending_overfull"] += int(out["pending_overfull"])
        for node in (set(by_node) - seen):
            # A node the API no longer reports while its pods still hold cards (deleted, or its capacity
            # went to 0): keep their usage on placeholder cards, so it is there if the node comes back.
            await self.list_node(node)
            out = await self.replace_node(Inventory(node), by_node[node], keep(), keep_bound,
                                          verify_after_ms=verify_after_ms, lost=lost, truth_at=at.get(node))
            _count_verified(stats, out)
            stats["kept_bound"] += len(out["kept_bound"])
            stats["pending_kept"] += int(out["pending_kept"])
            seen.add(node)
        for node in set(await self.nodes()) - seen:
            if await self.remove_node(node, keep()) is None:
                # held by no pod the API knows of, but a reservation still settles there: it stays (on
                # placeholder cards), the rest goes
                out = await self.replace_node(Inventory(node), {}, keep(), keep_bound,
                                              verify_after_ms=verify_after_ms, lost=lost, truth_at=at.get(node))
                _count_verified(stats, out)
                stats["pending_kept"] += int(out["pending_kept"])
            else:
                stats["removed"] += 1
        await self._retry("set", lambda: self.redis.set(self.epoch_key, str(now_ms())))
        return stats


def verified_by(out: Mapping[str, Any]) -> bool:
    """Whether the write that gave this replace_node answer verified the node (it was unverified before it: the
    script is atomic, so no other write says so for the same change of Redis's history)."""
    return bool(out.get("verified") and out.get("was_unverified"))


def _count_verified(stats: dict[str, int], out: Mapping[str, Any]) -> None:
    """A rebuild's replace_node answer in its counts: a node still unverified, or one this write verified."""
    stats["unverified"] += 0 if out.get("verified") else 1
    stats["verified"] += 1 if verified_by(out) else 0


def _since(started: float) -> int:
    """Milliseconds since `started` (time.monotonic())."""
    return int((time.monotonic() - started) * 1000)


def _keep_window(keep_ms: int, started: float) -> int:
    """`keep_ms` counted back from `started` rather than from now, within what the scripts take (KEEP_MS_MAX: a
    day, the watchers' "keep everything" while their pod view is stale, must not become a refusal on a resend)."""
    return min(KEEP_MS_MAX, max(0, int(keep_ms)) + _since(started))


def _may_have_run(resent: Iterable[BaseException]) -> bool:
    """Whether a command sent again after these errors may have run before (its reply lost): a timeout or a lost
    connection, not a refusal (READONLY, a slot being moved, NOREPLICAS from a replaced master) that ran nothing."""
    return any(isinstance(e, (rexc.TimeoutError, rexc.ConnectionError)) and not isinstance(e, MasterReplaced)
               for e in resent)
