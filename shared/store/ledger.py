"""The Ledger: shared per-card state in Redis, changed only by atomic Lua scripts.

Every change is one script on one node's keys (one hash tag per node, so it also works on Redis
Cluster), idempotent by pod UID, with every key it touches in KEYS (shared/store/keys.py). Redis is
rebuildable state: the API server's pod annotations are the durable record, and `rebuild` recomputes
everything from them. Scripts live in shared/store/lua/ and are redis-py script objects: loaded once
and called by SHA (redis-py loads a script again after NOSCRIPT, e.g. when Redis restarted).
Key layout: docs/redis-layout.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar, cast

import orjson
from redis import exceptions as rexc
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript

from shared.domain.annotations import PodUsage
from shared.domain.fit import CardNeed, Plan, Reasons
from shared.domain.node import Inventory
from shared.domain.state import NodeSnapshot
from shared.serving.metrics import REDIS_EVICTED_KEYS, REDIS_RESENDS, REDIS_ROUND_TRIPS
from shared.store.eviction import eviction_refusal, evicts_ledger
from shared.store.keys import MOREKEYS, NOTHING, Known, Layout
from shared.store.redis_conn import NO_OPTIONS, RedisOptions, connect, connect_subscriber, explain, is_sentinel
from shared.store.resend import (
    RESEND,
    RESEND_OR_REDIRECT,
    ClosedUnderCommand,
    UnknownRedirect,
    resendable,
    slot_moving,
)
from shared.store.scripts import LUA_DIR, SCRIPTS, script_source, scripts_digest

# The connection helpers (shared/store/redis_conn.py), the resend rule (resend.py) and the scripts' sources
# (scripts.py) live apart; callers keep importing them from here.
__all__ = ["LUA_DIR", "NO_OPTIONS", "RESEND", "RESEND_OR_REDIRECT", "SCRIPTS", "ClosedUnderCommand", "Ledger",
           "LedgerError", "RedisOptions", "ReserveOutcome", "UnknownRedirect", "connect", "connect_subscriber",
           "explain", "now_ms", "resendable", "script_source", "scripts_digest", "slot_moving"]

log = logging.getLogger("mtsched.ledger")
# A Redis outage makes every call in flight resend about ten times in its retry_seconds: a line each was hundreds
# of lines a second on a busy extender. One line per operation this often (with how many it stands for); the
# counter mtsched_redis_resends_total has them all.
RESEND_LOG_EVERY_S = 1.0
T = TypeVar("T")
# Calls of one script while it answers MOREKEYS. One more is needed whenever the node gained a reservation
# (or a card) since the keys were last seen; a node changing that fast is rare, but the stress test's three
# replicas booking one node without pause made a snapshot ask up to 12 times.
KEY_ROUNDS = 32
# Nodes per pipelined read: packing, parsing and decoding one reply holds the caller's event loop, so a
# read of 5,000 nodes (a mirror's resync, a reconcile pass) is cut where the loop can serve requests.
SNAPSHOT_BATCH = 250
HEADS_BATCH = 1000  # nodes per pipelined read of (version, stamp): two short fields each
# The reserve script's refusal on a node not compared with the API server since Redis's process changed
# (reserve.lua, `verified` in _lib.lua): replanning cannot help, the watchers' comparison does.
UNVERIFIED = "node unverified"
OTHER_AMOUNTS = "booked with other amounts"  # reserve.lua: the uid holds a booking of another size
# for the readiness probe: whether INFO holds both parts of the history token the scripts read (`server_info` in
# _lib.lua); "" when either is missing
RUN_ID_SCRIPT = ("return (string.match(redis.call('INFO', 'server'), 'run_id:(%x+)') "
                 "and string.match(redis.call('INFO', 'replication'), 'master_replid:(%x+)')) or ''")
NOTICES = ("wake", "verify")  # the feed's notices to the watchers (Ledger.notify)
MARK_BOUND_MAX = 512  # reservations per mark_bound call (mark_bound.lua checks the same bound)


@dataclass(frozen=True)
class Reread:
    """What Ledger.reread read: the snapshots of the nodes that exist and were decoded, the nodes whose reply
    was the text `previous` named (not decoded), and each reply's digest (also of nodes that do not exist).
    `moving` (with `isolate`): the nodes that could not be read for a live reshard of their slot (slot_moving)."""

    snaps: dict[str, NodeSnapshot]
    unchanged: set[str]
    digests: dict[str, int]
    moving: set[str] = field(default_factory=set)


class LedgerError(RuntimeError):
    """A script refused its input (BADINPUT) or Redis failed; state is unchanged."""


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
    # committed (the janitor waits for it), and this attempt's number among the pod's bind attempts on the
    # booking, which its give-back passes (Ledger.give_back). 0: no hold asked
    settle_by: int = 0
    bind_no: int = 0

    @property
    def reason(self) -> str:
        """Why not, as text (HAMi's "N/M Reason" for card counts): for bind errors and logs."""
        return self.reasons.text if self.reasons is not None else self.refused


class Ledger:
    def __init__(self, redis: Redis, prefix: str = "mt"):
        self.redis = redis
        self.prefix = prefix
        self.keys = Layout(prefix)
        self.feed = self.keys.feed
        self.nodes_key = self.keys.nodes
        self.epoch_key = self.keys.epoch  # set by every rebuild; its absence means the state was lost
        self._scripts = {n: redis.register_script(self._source(n)) for n in SCRIPTS}
        # each node's cards and reservations as last seen: declared in KEYS when a script may need them
        self._known: dict[str, Known] = {}
        self.round_trips = 0  # counted for benchmarks: every call to Redis adds one
        self.connection_retries = 2  # sends again after a connection error (see _retry) ...
        self.retry_seconds = 3.0  # ... and keeps trying this long (a Sentinel failover takes seconds)
        self._resend_said: dict[str, tuple[float, int]] = {}  # op -> (when a resend was last logged, not since)
        # op -> the line due when its second ends, for the resends held back since the last (an outage's last ones
        # were told by no line: no later resend came to say how many)
        self._resend_due: dict[str, asyncio.TimerHandle] = {}
        # told the node whenever a script on it fails because a live reshard has its keys split between two
        # shards (slot_moving): the mirror then offers it to no filter until it can read it again
        self.on_moving: list[Callable[[str], None]] = []

    def node_key(self, node: str) -> str:
        return self.keys.node(node)

    @staticmethod
    def _source(name: str) -> str:
        return script_source(name)

    async def load_scripts(self) -> None:
        """Load every script now (fails early when Redis cannot be reached); calls would load them too.

        A PING first: Redis answers a client that has not authenticated with NOAUTH (AuthenticationError)
        only for small commands; a script (over 16 KB with _lib.lua) gets "Protocol error:
        unauthenticated bulk length" (a plain ResponseError) and the connection closed. redis-py 8
        authenticates with HELLO on connect, so it met the NOAUTH first; redis-py 7 sends the script
        first."""
        await cast("Awaitable[bool]", self.redis.ping())  # redis-py 7's hints: `Awaitable[bool] | bool`
        for name, script in self._scripts.items():
            sha = await self.redis.script_load(script.script)
            assert sha == script.sha, f"script {name}: Redis returned {sha}"

    def _say_resend(self, what: str, e: BaseException, failures: int) -> None:
        now = time.monotonic()
        said, quiet = self._resend_said.get(what, (now - RESEND_LOG_EVERY_S, 0))
        if now - said < RESEND_LOG_EVERY_S:
            self._resend_said[what] = (said, quiet + 1)
            due = self._resend_due.get(what)
            if due is None or due.cancelled():
                try:
                    loop = asyncio.get_running_loop()
                except RuntimeError:  # (called outside a loop: no line owed)
                    return
                self._resend_due[what] = loop.call_later(said + RESEND_LOG_EVERY_S - now, self._say_held, what, e)
            return
        self._resend_said[what] = (now, 0)
        log.warning("%s: %s; sending again (%d)%s", what, e, failures,
                    f"; {quiet} more resends of {what} in the last {now - said:.1f}s not logged" if quiet else "")

    def _say_held(self, what: str, e: BaseException) -> None:
        """The line owed at the end of a second: how many resends of `what` no line has told yet (none, once a later
        resend's line told them)."""
        self._resend_due.pop(what, None)
        said, quiet = self._resend_said.get(what, (0.0, 0))
        if not quiet:
            return
        now = time.monotonic()
        self._resend_said[what] = (now, 0)
        log.warning("%s: %d more resends in the last %.1fs not logged (the first: %s)", what, quiet, now - said, e)

    async def _retry(self, what: str, op: Callable[[], Awaitable[T]],
                     give_up: Callable[[BaseException], bool] | None = None,
                     resent: list[BaseException] | None = None) -> T:
        """One round trip, sent again on a RESEND error (`connection_retries` times, and until `retry_seconds`);
        one that `give_up` accepts is raised at once (a reader that can do without the node: slot_moving).

        A pooled connection that died with a Redis restart fails once and then reconnects. Sending
        again is safe: every script is idempotent by pod uid (a reserve whose reply was lost answers
        the second time with the cards it booked), and so are SADD/SREM/SMEMBERS/EXISTS/SET.
        `resent` (a caller's list) is told each error a send was repeated after: one that may have run, its reply
        lost (a timeout, a connection cut), is answered again as by a second run (a release: nothing held).
        """
        failures = 0
        deadline = time.monotonic() + self.retry_seconds
        while True:
            self.round_trips += 1
            REDIS_ROUND_TRIPS.labels(what).inc()
            try:
                return await op()
            except RESEND_OR_REDIRECT as raw:
                e = resendable(raw, self.redis)
                if e is None:
                    raise
                failures += 1
                # a few quick tries (a pooled connection that died), then more while a failover settles
                if (give_up is not None and give_up(e)) or (
                        failures > self.connection_retries and time.monotonic() > deadline):
                    if e is raw:
                        raise
                    raise e from raw
                REDIS_RESENDS.labels(what).inc()
                self._say_resend(what, e, failures)
                if resent is not None:
                    resent.append(e)
                if isinstance(e, rexc.ReadOnlyError):
                    # the server we reach was demoted to a replica (a VIP or DNS name that moved on): new
                    # connections find the new master
                    pool = getattr(self.redis, "connection_pool", None)
                    if pool is not None:
                        await pool.disconnect()
                elif isinstance(e, rexc.TimeoutError) and not isinstance(self.redis, RedisCluster):
                    # the server stopped answering (hung, cut off: redis_conn.SOCKET_TIMEOUT): the idle
                    # connections to it go too, or each would hang one call more; new ones ask the sentinels, or
                    # reach what the address names now (redis-py's cluster client does the same for its nodes)
                    await self.redis.connection_pool.disconnect(inuse_connections=False)
                await asyncio.sleep(min(0.5, 0.05 * (failures - 1)))

    def known(self, node: str) -> Known:
        return self._known.get(node, NOTHING)

    def _saw(self, node: str, cards: Iterable[str] = (), uids: Iterable[str] = (), gone: Iterable[str] = ()) -> None:
        k = self.known(node)
        self._known[node] = Known(k.cards | frozenset(cards), (k.uids | frozenset(uids)) - frozenset(gone))

    def forget(self, node: str, uid: str | None = None) -> None:
        """What this process knows of `node`'s keys (what its scripts declare) is stale: the node is gone (`uid`
        None), or reservation `uid` of it was released by another process (the feed said so). Kept, a cluster
        whose nodes and pods churn grew it for ever, and each booking declared every uid released since
        (red team: 13x slower reserves on a busy node)."""
        if uid is None:
            self._known.pop(node, None)
        elif uid in self.known(node).uids:
            self._saw(node, gone=(uid,))

    def known_nodes(self) -> set[str]:
        return set(self._known)

    def _learn(self, node: str, snap: NodeSnapshot | None) -> None:
        if snap is None:
            self._known.pop(node, None)
        else:
            self._known[node] = Known(frozenset(map(str, snap.cards)), frozenset(snap.reservations))

    async def _call(self, name: str, node: str, payload: Mapping[str, Any] | None = None,
                    keys: Callable[[Known], list[str]] | None = None,
                    give_up: Callable[[BaseException], bool] | None = None,
                    resent: list[BaseException] | None = None) -> Any:
        """Run one script on one node. `keys` makes its KEYS from what is known of the node (default:
        every key of the node); after MOREKEYS it is called again with what the script asked for."""
        script = self._scripts[name]
        args = (self.feed, node, orjson.dumps(payload or {}).decode())
        make = keys or (lambda known: self.keys.whole_node(node, known))
        for _ in range(KEY_ROUNDS):
            declared = make(self.known(node))
            try:
                return await self._retry(name, partial(self._script, script, declared, args), give_up, resent)
            except Exception as e:
                if slot_moving(e):  # raised as it is (TRYAGAIN is a ResponseError too): Redis unavailable there
                    self._moving(node)
                    raise
                if not isinstance(e, rexc.ResponseError):
                    raise
                if not str(e).startswith(MOREKEYS):
                    raise LedgerError(f"{name} on {node}: {e}") from e
                self._known[node] = self.known(node).learn(str(e))
                log.debug("%s on %s: the node has keys this ledger did not know of; calling again", name, node)
        raise LedgerError(f"{name} on {node}: the node's cards and reservations kept changing; try again")

    async def _script(self, script: AsyncScript, keys: list[str], args: tuple[str, str, str]) -> Any:
        """One send of `script` (routed by `keys[0]`). redis-py's script object sends EVALSHA, and on NOSCRIPT
        loads the script and sends it again; a second NOSCRIPT is answered here."""
        try:
            return await script(keys, args)
        except rexc.NoScriptError:
            if isinstance(self.redis, RedisCluster):
                # redis-py loads it on the primaries its node list names, which after a failover may lack the
                # promoted replica the call is routed to (tests/redis_ha/test_failover.py, Redis 6.2): loaded where
                # the key lives, then sent again
                await self._load_where(script.script, keys[0])
            else:
                # gone again between redis-py's load and its second EVALSHA (another SCRIPT FLUSH: an operator's,
                # or a replica of another release during an upgrade): loaded and sent once more, not failed as a
                # script error (tests/redis/test_redteam_script_flush.py)
                await self.redis.script_load(script.script)
            return await script(keys, args)

    async def _load_where(self, text: str, key: str) -> None:
        """Load a script on the cluster primary that holds `key` (redis-py's own load may miss it: above)."""
        assert isinstance(self.redis, RedisCluster)
        owner = self.redis.get_node_from_key(key)
        await self.redis.execute_command("SCRIPT LOAD", text, target_nodes=owner)

    def _moving(self, node: str) -> None:
        for listener in list(self.on_moving):
            try:
                listener(node)
            except Exception:  # a listener's bug must not replace the caller's error
                log.exception("on_moving listener failed for node %s", node)

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
                await self._retry("srem", lambda: cast("Awaitable[int]", self.redis.srem(self.nodes_key, inv.node)))
            raise
        if version < 0:
            return version
        self._saw(inv.node, cards=(str(c.index) for c in inv.cards))  # (and those still held, known before)
        if not create:
            await self.list_node(inv.node)
        return version

    async def remove_node(self, node: str, keep_ms: int | None = None) -> bool | None:
        """Forget a node and everything booked on it; True if it existed. With `keep_ms`, a node where a
        reservation is still settling (pending, or made or bound in the last `keep_ms` ms) is left as it is
        and None is returned: its binder writes the Binding whatever the ledger says, so the caller keeps
        the booking (replace_node onto placeholder cards) instead of forgetting it."""
        payload = {} if keep_ms is None else {"keep_ms": max(0, int(keep_ms))}
        out = int(await self._call("remove_node", node, payload))
        if out < 0:
            return None
        self._known.pop(node, None)
        await self._retry("srem", lambda: cast("Awaitable[int]", self.redis.srem(self.nodes_key, node)))
        return bool(out)

    async def announce(self, node: str) -> None:
        """Tell every mirror to re-read `node` (a `rebuild` notice on the feed; no state changes)."""
        msg = orjson.dumps({"node": node, "version": 0, "kind": "rebuild"}).decode()
        await self._retry("publish", lambda: self.redis.publish(self.feed, msg))

    async def notify(self, kind: str, node: str) -> None:
        """A notice to the watchers on the feed (no state changes; Mirror.on_notice), one of NOTICES:
        `wake`: nudge kube-scheduler about `node`, where cards an extender replica held for a bind that never
        came are free again and pods it turned away meanwhile wait for a cluster event;
        `verify`: compare `node` with the API server now, as a booking there was refused for want of it
        (UNVERIFIED). Version 0: a mirror that does not know the kind ignores it."""
        if kind not in NOTICES:
            raise ValueError(f"notice kind {kind!r}: allowed {', '.join(NOTICES)}")
        msg = orjson.dumps({"node": node, "version": 0, "kind": kind}).decode()
        await self._retry("publish", lambda: self.redis.publish(self.feed, msg))

    async def list_node(self, node: str) -> int:
        added: int = await self._retry("sadd", lambda: cast("Awaitable[int]", self.redis.sadd(self.nodes_key, node)))
        return added

    async def nodes(self) -> list[str]:
        members: Awaitable[set[str]] = self._retry("smembers", lambda: self.redis.smembers(self.nodes_key))  # type: ignore[arg-type,return-value]
        return sorted(await members)

    # -- reservations --------------------------------------------------------------------------

    async def reserve(self, node: str, uid: str, cards: Sequence[int], mem: int, cores: int, slices: int,
                      model: int = 0, whole: bool = False, pod: str = "",
                      need: CardNeed | None = None, hold_ms: int = 0) -> tuple[ReserveOutcome, NodeSnapshot | None]:
        """Check-and-book on the given cards. On conflict returns the node's fresh state too: all its cards
        (or None, when the node has cards this ledger did not know of) and the reservations it knew of.
        `hold_ms` (a binder): its Binding may be committed until that long from now, so neither the janitor nor
        an earlier attempt's give-back releases the booking before (answered as `settle_by`).

        With `need` (a Plan's), the script checks every card with the twin of shared.domain.fit.card_rule on
        exactly those terms; `model`/`whole` are the short form (accepts {model}, require idle)."""
        payload: dict[str, Any] = {"uid": uid, "cards": list(cards), "mem": mem, "cores": cores, "slices": slices,
                                   "model": model, "whole": whole, "pod": pod}
        if hold_ms:
            payload["hold_ms"] = hold_ms
        if need is not None:
            payload.update(mem=need.memory, cores=need.cores, slices=need.slices, idle=need.require_idle,
                           deny=sorted(need.deny))
            if need.accepts is not None:
                payload["accepts"] = sorted(need.accepts)
        raw = await self._call("reserve", node, payload, lambda k: self.keys.reserve(node, uid, cards, k))
        out = orjson.loads(raw)
        if out["ok"]:
            self._saw(node, uids=[uid])
            got = tuple(int(x) for x in str(out["cards"]).split(",") if x)
            feed = out.get("feed")
            return ReserveOutcome(True, got, existing=bool(out.get("existing")),
                                  feed=feed if isinstance(feed, dict) else None,
                                  settle_by=int(out.get("settle_by") or 0), bind_no=int(out.get("bind_no") or 0)), None
        snap = NodeSnapshot.from_json(out["node"]) if out.get("node") else None
        return ReserveOutcome(False, refused=str(out.get("reason", ""))), snap

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
                                     feed=outcome.feed, settle_by=outcome.settle_by, bind_no=outcome.bind_no)
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

    async def release(self, node: str, uid: str, give_up: Callable[[BaseException], bool] | None = None) -> bool:
        """Give a pod's share back; True if something was held. Idempotent. `give_up`: as in _retry."""
        fate, _ = await self.give_back(node, uid, give_up=give_up)
        return fate == "released"

    async def release_feed(self, node: str, uid: str) -> tuple[bool, Mapping[str, Any] | None]:
        """As release, with the feed message the script published (None if nothing was held), for the
        caller's mirror (Mirror.apply) at once."""
        fate, feed = await self.give_back(node, uid)
        return fate == "released", feed

    async def give_back(self, node: str, uid: str, bind_no: int | None = None,
                        give_up: Callable[[BaseException], bool] | None = None) -> tuple[str, Mapping[str, Any] | None]:
        """Release a pod's booking: "released" (with the feed message, as release_feed), "gone" (nothing
        held) or, with `bind_no` (a binder giving back its own booking: the `bind_no` its reserve answered),
        "kept" when a later bind attempt of the pod holds it (release.lua)."""
        body: dict[str, Any] = {"uid": uid}
        if bind_no is not None:
            body["if_bind_no"] = bind_no
        resent: list[BaseException] = []
        out = orjson.loads(await self._call("release", node, body,
                                            lambda k: self.keys.release(node, uid, k), give_up, resent=resent))
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

    # -- reads ---------------------------------------------------------------------------------

    async def snapshot(self, node: str, give_up: Callable[[BaseException], bool] | None = None) -> NodeSnapshot | None:
        d = orjson.loads(await self._call("snapshot", node, give_up=give_up))
        snap = NodeSnapshot.from_json(d) if d.get("exists") else None
        self._learn(node, snap)
        return snap

    async def heads(self, nodes: Iterable[str], isolate: bool = False) -> dict[str, tuple[int, str]]:
        """(version, stamp) of each node that has keys: its last scripted write (publish in _lib.lua), read with
        one HMGET per node, HEADS_BATCH per pipelined round trip (no script: ~100 times cheaper for Redis than a
        snapshot). A node written before stamps existed has stamp "". `isolate` (as in reread): a node that
        cannot be read while its slot moves is left out, like a node without keys."""
        names = list(dict.fromkeys(nodes))
        out: dict[str, tuple[int, str]] = {}
        for i in range(0, len(names), HEADS_BATCH):
            batch = names[i:i + HEADS_BATCH]

            async def read(items: list[tuple[str, list[str]]]) -> list[Any]:
                pipe = self.redis.pipeline(transaction=False)
                for n, _ in items:
                    pipe.hmget(self.node_key(n), ["version", "stamp"])
                return await pipe.execute()

            got = await self._read_around("heads", [(n, []) for n in batch], read, isolate, Reread({}, set(), {}))
            for (n, _), (version, stamp) in got:
                if version is not None:
                    try:
                        out[n] = (int(version), str(stamp or ""))
                    except ValueError:  # a hash edited by hand: names no write, so the node is read
                        out[n] = (-1, "")
        return out

    async def snapshots(self, nodes: Iterable[str]) -> dict[str, NodeSnapshot]:
        """Many nodes, SNAPSHOT_BATCH per round trip (pipelined): each node's read is atomic, the whole never
        was (a pipeline is not a transaction), so the cut changes nothing a caller may rely on."""
        return (await self.reread(nodes, {})).snaps

    async def reread(self, nodes: Iterable[str], previous: Mapping[str, int], isolate: bool = False,
                     apart: Collection[str] = ()) -> Reread:
        """snapshots(), except that a node whose reply is the very text whose digest `previous` holds is not
        decoded again (a mirror's resync: at 5,000 nodes decoding every reply held each role's loop for
        ~1 s every 30 s, and almost every node is as it was). The digests are this process's `hash`
        of the reply text, so they are compared only within the process that made them.
        `isolate`: a round trip that failed for a slot being moved (slot_moving, once its retries ran out) is
        read again node by node, and the nodes that fail so are left out, in `moving`, instead of failing the
        whole read: one node's keys split between shards does not keep every other node from being read. Such a
        failure is not sent again (redis-py has retried TRYAGAIN 16 times already). `apart` (with `isolate`):
        nodes read alone, first (the ones known to be moving: their failure then costs no batch a try).
        Every read here is bounded: redis-py's own tries, then `retry_seconds` only for Redis unavailable."""
        names = list(dict.fromkeys(nodes))
        out = Reread({}, set(), {})
        alone = [n for n in names if n in apart] if isolate else []
        if alone:
            for n in alone:
                if await self.slot_open(n):  # (its read alone may go through while every booking fails)
                    out.moving.add(n)
                    continue
                await self._snapshot_batch([n], previous, out, isolate)
            names = [n for n in names if n not in apart]
        for i in range(0, len(names), SNAPSHOT_BATCH):
            await self._snapshot_batch(names[i:i + SNAPSHOT_BATCH], previous, out, isolate)
        return out

    async def _read_around(self, what: str, batch: list[tuple[str, list[str]]],
                           read: Callable[[list[tuple[str, list[str]]]], Awaitable[list[Any]]], isolate: bool,
                           out: Reread) -> list[tuple[tuple[str, list[str]], Any]]:
        """(node and keys, reply) of one pipelined read of a batch. With `isolate`, a read that failed for a moving
        slot is not sent again but read node by node (_one_by_one), the moving nodes left out, in out.moving."""
        try:
            return list(zip(batch, await self._retry(what, lambda: read(batch), slot_moving if isolate else None),
                            strict=True))
        except RESEND_OR_REDIRECT as e:  # as _retry raised it (resendable() applied)
            if not isolate or not slot_moving(e):
                raise
            if len(batch) == 1:
                out.moving.add(batch[0][0])
                return []
            return await self._one_by_one(batch, read, out, what)

    async def _one_by_one(self, batch: list[tuple[str, list[str]]],
                          read: Callable[[list[tuple[str, list[str]]]], Awaitable[list[Any]]],
                          out: Reread, what: str = "snapshots") -> list[tuple[tuple[str, list[str]], Any]]:
        """Each node of a batch whose read failed for a moving slot read alone (sent again only for Redis
        unavailable): (node and keys, reply) of those read; the ones that fail for a move go to out.moving.
        Any other failure is raised as the batch's would be."""
        got = []
        for item in batch:
            def one(item: tuple[str, list[str]] = item) -> Awaitable[list[Any]]:
                return read([item])

            try:
                got.append((item, (await self._retry(what, one, slot_moving))[0]))
            except RESEND_OR_REDIRECT as e:  # as _retry raised it (resendable() applied)
                if not slot_moving(e):
                    raise
                out.moving.add(item[0])
        return got

    async def slot_open(self, node: str) -> bool:
        """Whether the node's slot is being moved between two shards of a Redis Cluster (a live reshard, or one left
        half-done), wherever its keys are meanwhile: Redis then refuses a command naming one key of the slot that
        exists and one that does not (TRYAGAIN, or ASK and then TRYAGAIN), as it refuses every booking (reserve
        names the new pod's key) for the whole move. A read of the node's existing keys alone may go through then,
        so a node known to be moving is asked this first (reread `apart`). False off a Cluster."""
        if not isinstance(self.redis, RedisCluster):
            return False
        keys = (self.keys.node(node), self.keys.slot_probe(node))
        try:
            await self._retry("slot_probe", lambda: cast("Awaitable[int]", self.redis.exists(*keys)), slot_moving)
        except RESEND_OR_REDIRECT as e:  # as _retry raised it (resendable() applied)
            if not slot_moving(e):
                raise
            return True
        return False

    def _slot_moving(self, raw: Any) -> bool:
        """A pipelined reply that failed for a slot being moved (slot_moving, redis-py's AttributeError read)."""
        e = resendable(raw, self.redis) if isinstance(raw, BaseException) else None
        return e is not None and slot_moving(e)

    async def _snapshot_batch(self, nodes: list[str], previous: Mapping[str, int], out: Reread,
                              isolate: bool = False) -> None:
        """Nodes in one round trip (pipelined); one more for the nodes whose keys changed (MOREKEYS).

        The one place without redis-py's script object: in a pipeline it would send SCRIPT EXISTS before
        every execute (a round trip more each time) and it does not work with cluster pipelines at all,
        so EVALSHA is queued by hand and NOSCRIPT is answered here, by loading the script once.
        """
        script = self._scripts["snapshot"]
        todo = nodes
        for _ in range(KEY_ROUNDS + 1):
            if not todo:
                break
            batch = [(n, self.keys.snapshot(n, self.known(n))) for n in todo]

            async def read(batch: list[tuple[str, list[str]]] = batch) -> list[Any]:
                def queue() -> Any:
                    pipe = self.redis.pipeline(transaction=False)
                    for n, keys in batch:
                        pipe.evalsha(script.sha, len(keys), *keys, self.feed, n, "{}")
                    return pipe

                # each node's answer in its place (MOREKEYS or NOSCRIPT for some must not lose the others);
                # after a shard's or connection's failure send again raising, which is how redis-py's
                # cluster pipeline resends after refreshing its layout (a script's error: read in place)
                raws: list[Any] = await queue().execute(raise_on_error=False)
                if isolate and (moving := next((r for r in raws if self._slot_moving(r)), None)) is not None:
                    raise moving  # nothing to gain from sending it again: read around it
                if any(map(_failed, raws)):
                    try:
                        raws = await queue().execute()
                    except rexc.ResponseError as e:
                        if _failed(e):
                            raise
                        raws = await queue().execute(raise_on_error=False)
                # a node's failure for want of Redis is raised here, inside _retry (sent again; redis-py's own
                # AttributeError read as UnknownRedirect), also when another node's MOREKEYS came first above
                failed = next((r for r in raws if _failed(r)), None)
                if failed is not None:
                    raise failed
                return raws

            got = await self._read_around("snapshots", batch, read, isolate, out)
            todo, noscript = [], []  # noscript: the first key of each node answered NOSCRIPT
            for (n, keys), raw in got:
                if isinstance(raw, rexc.NoScriptError):
                    todo.append(n)
                    noscript.append(keys[0])
                elif isinstance(raw, rexc.ResponseError) and str(raw).startswith(MOREKEYS):
                    todo.append(n)
                    self._known[n] = self.known(n).learn(str(raw))
                elif isinstance(raw, Exception):
                    raise LedgerError(f"snapshot of {n}: {raw}") from raw
                else:
                    digest = hash(raw)
                    out.digests[n] = digest
                    if previous.get(n) == digest:
                        out.unchanged.add(n)  # the same text as before: the same value (and the same keys)
                        continue
                    d = orjson.loads(raw)
                    snap = NodeSnapshot.from_json(d) if d.get("exists") else None
                    if snap is not None:
                        out.snaps[n] = snap
                    self._learn(n, snap)
            if noscript:  # Redis restarted or flushed (or a promoted replica): load it and read those again
                log.info("snapshot script missing in Redis (restarted or flushed?): loading it")
                await self._retry("script_load", lambda: self.redis.script_load(script.script))
                if isinstance(self.redis, RedisCluster):
                    # and where each node's keys live: redis-py loads it on the primaries its node list names,
                    # which after a failover may lack the promoted replica the reads go to (each read then
                    # answered NOSCRIPT again, until "kept changing" after KEY_ROUNDS: a red team's probe)
                    owners = {self.redis.get_node_from_key(k).name: k for k in noscript}
                    for key in owners.values():
                        await self._retry("script_load", lambda key=key: self._load_where(script.script, key))
        if todo:
            raise LedgerError(f"snapshots: the keys of {', '.join(todo)} kept changing; try again")

    # -- rebuild -------------------------------------------------------------------------------

    async def replace_node(self, inv: Inventory, bound: Mapping[str, tuple[PodUsage, str]],
                           keep_ms: int | None = None, keep_bound: bool = False,
                           keep_from: int | None = None, verify_after_ms: int | None = None,
                           lost: bool = False, truth_at: int | None = None) -> dict[str, Any]:
        """Atomically set one node to what the API implies: its cards and its bound pods' usage.

        Reservations still settling (pending, or made or bound in the last `keep_ms` ms of Redis time or
        since `keep_from`: newer than the caller's truth) are kept, whether or not they fit (their binder
        writes its Binding anyway); those on a card they leave over-full are counted in
        "pending_overfull". `keep_bound`: a pod of `bound` whose
        reservation is bound keeps that booking where its record differs; their uids come back as
        "kept_bound" (a list). "dropped": how many reservations it freed (of pods neither bound nor settling);
        "maybe_dropped": whether it freed some, or may have (a send whose reply was lost, then sent again).
        `verify_after_ms` (every writer in the roles; its truth is the API's): a node not verified under the
        history this Redis holds (its `run`, docs/redis-layout.md "Losing Redis") is verified by a truth read
        consistently from the API server at `truth_at` (Redis time, read before the read began), once that is
        `verify_after_ms` after a writer first found the node unverified; a truth without `truth_at` (a
        watch's view, which may lag) starts the window but verifies no such node. A node new to this Redis is
        verified at once, unless `lost` (its keys went with the state: the window starts now). "verified"
        says whether it is, "verify_in_ms" how long until a read may verify it. None (a view that is not
        live): a new node is verified at once, an existing one is left as it is.
        """
        payload = self._cards_payload(inv)
        if keep_ms is not None:
            payload["keep_ms"] = max(0, int(keep_ms))
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
        out: dict[str, Any] = orjson.loads(await self._call("replace_node", inv.node, payload, lambda k: (
            self.keys.replace_node(inv.node, (c.index for c in inv.cards), named, k)), resent=resent))
        out["kept_bound"] = list(out.get("kept_bound") or [])  # cjson sends an empty list as {}
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
        `keep_bound`: see replace_node (a rebuild over state Redis still has keeps what our bind booked).
        `freed` is called with each node whose replace dropped reservations (their cards are free again).
        `verify_after_ms`, `lost`, `truth_at` (by node: when the consistent read of the pods began): see
        replace_node (the watchers pass their keep window, so that a bind in flight when Redis's history changed
        is in their truth first, and `lost` after a state loss).
        "unverified" counts the nodes still waiting.
        """
        at = truth_at or {}
        by_node: dict[str, dict[str, tuple[PodUsage, str]]] = {}
        for uid, (usage, pod) in bound.items():
            by_node.setdefault(usage.node, {})[uid] = (usage, pod)
        seen = set()
        stats = {"nodes": 0, "bound": 0, "pending_kept": 0, "pending_overfull": 0, "removed": 0, "kept_bound": 0,
                 "dropped": 0, "unverified": 0}
        for inv in inventories:
            seen.add(inv.node)
            await self.list_node(inv.node)  # listed first, see upsert_node
            out = await self.replace_node(inv, by_node.get(inv.node, {}), keep_ms, keep_bound,
                                          verify_after_ms=verify_after_ms, lost=lost, truth_at=at.get(inv.node))
            stats["unverified"] += 0 if out.get("verified") else 1
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
            out = await self.replace_node(Inventory(node), by_node[node], keep_ms, keep_bound,
                                          verify_after_ms=verify_after_ms, lost=lost, truth_at=at.get(node))
            stats["unverified"] += 0 if out.get("verified") else 1
            stats["kept_bound"] += len(out["kept_bound"])
            stats["pending_kept"] += int(out["pending_kept"])
            seen.add(node)
        for node in set(await self.nodes()) - seen:
            if await self.remove_node(node, keep_ms) is None:
                # held by no pod the API knows of, but a reservation still settles there: it stays (on
                # placeholder cards), the rest goes
                out = await self.replace_node(Inventory(node), {}, keep_ms, keep_bound,
                                              verify_after_ms=verify_after_ms, lost=lost, truth_at=at.get(node))
                stats["unverified"] += 0 if out.get("verified") else 1
                stats["pending_kept"] += int(out["pending_kept"])
            else:
                stats["removed"] += 1
        await self._retry("set", lambda: self.redis.set(self.epoch_key, str(now_ms())))
        return stats

    async def redis_time_ms(self) -> int:
        """Redis's clock: the one every reservation's `created` and `bound_at` are stamped with."""
        sec, usec = await self._retry("time", lambda: self.redis.time())
        return int(sec) * 1000 + int(usec) // 1000

    async def mark_kept(self) -> None:
        """A ready watcher's stamp: the ledger is kept current now (shared/domain/upkeep.py). No time to live: a
        stamp that ages is what tells the extenders (one that vanished would say nothing). The clock is the one
        of the server holding the key (`_kept_clock`), the one its age is read on."""
        now = await self._kept_clock()
        await self._retry("kept", lambda: self.redis.set(self.keys.kept, str(now)))

    async def kept(self) -> tuple[int | None, int | None]:
        """The watchers' last stamp and how long ago (ms) it was, both on the clock of the server holding it;
        (None, None) when none ever did (or the stamp is not a number, or not a string: nothing this code
        wrote). A stamp from that clock's future (it stepped back since) is 0 ms old: the extender's own count
        ages it (controller/upkeep.py)."""
        try:
            raw = await self._retry("kept", lambda: cast("Awaitable[str | None]", self.redis.get(self.keys.kept)))
        except rexc.ResponseError as e:  # a key of another type: nothing this code wrote (a watcher's SET ends it)
            if str(e).startswith("WRONGTYPE"):
                return None, None
            raise
        try:
            stamped = int(raw) if raw is not None else None
        except ValueError:
            return None, None
        if stamped is None:
            return None, None
        return stamped, max(0, await self._kept_clock() - stamped)

    async def kept_age_ms(self) -> int | None:
        """How long ago (ms, Redis's clock) a watcher last stamped the ledger; None when none ever did."""
        return (await self.kept())[1]

    async def _kept_clock(self) -> int:
        """Redis's clock (ms) on the server holding `<prefix>:kept`: the clock script routed by that key (which it
        does not read). Not TIME: on a cluster redis-py sends that to its client's default node, any shard, and
        the skew between two shards' clocks would go straight into the stamp's age
        (tests/redis/test_redteam_upkeep.py)."""
        return int(await self._retry("clock", lambda: self._script(self._scripts["clock"], [self.keys.kept],
                                                                   (self.feed, "", "{}"))))

    async def clocks(self, nodes: Iterable[str]) -> dict[str, int]:
        """Redis's clock (ms) as the server holding each node's keys reads it: what a script on that node
        compares its stamps with. A cluster's shards each have their own clock: there the nodes are grouped
        by the shard the client's slot map gives them, and one of each group is asked through a script routed
        by its key (which follows a map that moved in a failover; a node whose slot moved meanwhile is read on
        a sibling's clock, which NTP keeps within milliseconds). Elsewhere there is one clock."""
        names = list(dict.fromkeys(nodes))
        if not isinstance(self.redis, RedisCluster):
            now = await self.redis_time_ms() if names else 0
            return {n: now for n in names}
        shards: dict[str, list[str]] = {}
        for n in names:
            shards.setdefault(self.redis.get_node_from_key(self.keys.node(n)).name, []).append(n)
        out: dict[str, int] = {}
        for members in shards.values():
            out.update(dict.fromkeys(members, await self.clock(members[0])))
        return out

    async def clock(self, node: str) -> int:
        """Redis's clock (ms) on the server holding `node`'s keys, through a script routed by its key."""
        return int(await self._call("clock", node, None, lambda _known: [self.keys.node(node)]))

    async def partition_risk(self) -> str:
        """Why a booking acknowledged here could be lost without a change of history the fence sees ("" when
        none is known): a Sentinel master that takes writes with no replica in reach (min-replicas-to-write
        is 0) goes on booking when cut off, and drops those bookings when it rejoins as a replica of the one
        promoted meanwhile (docs/install.md, docs/redis-layout.md "What the bound rests on")."""
        if isinstance(self.redis, RedisCluster):  # a primary stops taking writes after cluster-node-timeout itself
            return ""
        info = await self._retry("info", lambda: self.redis.info("replication"))
        if "min_slaves_good_slaves" in info:  # Redis reports it only with min-replicas-to-write set
            return ""
        if is_sentinel(self.redis):
            return ("the Sentinel master accepts writes with no replica in reach (min-replicas-to-write 0): "
                    "bookings made on it while it is cut off are lost when it rejoins, unseen by the fence")
        # one address (a managed Redis, a VIP) in front of a master with replicas: whatever fails it over
        if info.get("role") == "master" and int(info.get("connected_slaves") or 0) > 0:
            return ("the Redis master has replicas but accepts writes with none in reach (min-replicas-to-write "
                    "0): if it is failed over, bookings made on it while it is cut off are lost, unseen by the "
                    "fence")
        return ""

    async def probe_write(self) -> bool:
        """A write, for readiness: a Redis that answers but refuses writes (full under noeviction: OOM; a replica:
        READONLY) leaves no role able to book, bind, record or release. Then the run id the scripts read
        (`server_info` in _lib.lua): without it (an ACL user without `info`, a proxy that hides it) no node is
        ever verified and no booking made. Raises what Redis answered, or LedgerError."""
        # no time to live: a volatile-* Redis has nothing of ours to evict (shared/store/eviction.py)
        ok = bool(await self.redis.set(self.keys.probe, str(time.time_ns() // 1_000_000)))
        # routed by the key on a cluster, to a shard that holds nodes like any other
        run = await cast("Awaitable[str]", self.redis.eval(RUN_ID_SCRIPT, 1, self.keys.probe))
        if not run:
            raise LedgerError("this Redis reports no run_id or master_replid in INFO: no node can be verified after "
                              "a restart or failover, so none is booked (docs/redis-layout.md, Losing Redis)")
        evicting = await self.evicting_policy()
        if evicting:  # reserve.lua refuses every booking there, atomically; this says so in readiness
            raise LedgerError(eviction_refusal(evicting))
        return ok

    async def primary_infos(self, *sections: str) -> dict[str, dict[str, Any]]:
        """INFO `sections` of each primary, by its address ("" for a single server or Sentinel's master), one
        call per section (several in one call is Redis 7's). A Cluster's primary that does not answer is left
        out: the others are read, as their shards keep serving."""
        if not isinstance(self.redis, RedisCluster):
            info: dict[str, Any] = {}
            for section in sections:
                def read(section: str = section) -> Awaitable[dict[str, Any]]:
                    return cast("Awaitable[dict[str, Any]]", self.redis.info(section))
                info.update(await self._retry("info", read))
            return {"": info}
        out: dict[str, dict[str, Any]] = {}
        await self.redis.initialize()  # a client that has sent nothing yet knows no slot
        for node in slot_owners(self.redis):
            info = {}
            try:
                for section in sections:
                    info.update(await self.redis.info(section, target_nodes=node))
            except RESEND as e:
                log.debug("INFO of %s not read: %s", node.name, e)
                continue
            out[node.name] = info
        return out

    async def evicted_counts(self) -> dict[str, int]:
        """Each primary's evicted_keys (INFO stats), by its address (primary_infos)."""
        return {name: int(i.get("evicted_keys") or 0) for name, i in (await self.primary_infos("stats")).items()}

    async def evicting_policy(self) -> str:
        """The `maxmemory-policy` of a server that may drop ledger keys when full (shared/store/eviction.py),
        on any primary of a Cluster that answers; "" when none may. Sets mtsched_redis_evicted_keys on the way."""
        infos = list((await self.primary_infos("memory", "stats")).values())
        REDIS_EVICTED_KEYS.set(sum(int(i.get("evicted_keys") or 0) for i in infos))
        return next((p for i in infos if evicts_ledger(p := str(i.get("maxmemory_policy", "")))), "")

    async def intact(self) -> bool:
        """False once Redis lost the state a rebuild wrote (restart without persistence, FLUSHALL)."""
        return bool(await self._retry("exists", lambda: self.redis.exists(self.epoch_key)))


def slot_owners(cluster: RedisCluster) -> list[Any]:
    """The primaries a cluster client routes to, from its slot map: after a failover redis-py's node list may
    still call the promoted replica a replica (get_primaries() lacks it) while its slots go there."""
    owners: dict[str, Any] = {}
    for nodes in cluster.nodes_manager.slots_cache.values():
        if nodes:
            owners.setdefault(nodes[0].name, nodes[0])
    return list(owners.values()) or list(cluster.get_primaries())


def _failed(raw: Any) -> bool:
    """A pipelined command that failed for want of Redis (connection, cluster down), not by its script."""
    return isinstance(raw, Exception) and (not isinstance(raw, rexc.ResponseError)
                                           or isinstance(raw, rexc.ClusterError | rexc.TryAgainError))


def _may_have_run(resent: Iterable[BaseException]) -> bool:
    """Whether a command sent again after these errors may have run before (its reply lost): a timeout or a lost
    connection, not a refusal (READONLY, a slot being moved) that ran nothing."""
    return any(isinstance(e, (rexc.TimeoutError, rexc.ConnectionError)) for e in resent)


def now_ms() -> int:
    return int(time.time() * 1000)
