"""The Ledger: shared per-card state in Redis, changed only by atomic Lua scripts.

Every change is one script on one node's keys (one hash tag per node, so it also works on Redis
Cluster), idempotent by pod UID. Redis is rebuildable state: the API server's pod annotations are
the durable record, and `rebuild` recomputes everything from them. Scripts live in shared/store/lua/,
are loaded once and called by SHA (reloaded after NOSCRIPT, e.g. when Redis restarted).
Key layout: docs/redis-layout.md.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson
from redis import exceptions as rexc
from redis.asyncio import Redis

from shared.domain.annotations import PodUsage
from shared.domain.fit import CardNeed, Plan, Reasons
from shared.domain.node import Inventory
from shared.serving.metrics import REDIS_ROUND_TRIPS
from shared.store.redis_conn import NO_OPTIONS, RedisOptions, connect, connect_subscriber, explain
from shared.store.state import NodeSnapshot

# The connection helpers moved to shared/store/redis_conn.py; callers keep importing them from here.
__all__ = ["LUA_DIR", "NO_OPTIONS", "SCRIPTS", "Ledger", "LedgerError", "RedisOptions", "ReserveOutcome", "connect",
           "connect_subscriber", "explain", "now_ms"]

log = logging.getLogger("mtsched.ledger")
T = TypeVar("T")
LUA_DIR = Path(__file__).with_name("lua")
SCRIPTS = ("upsert_node", "reserve", "mark_bound", "release", "observe", "expire", "snapshot", "replace_node",
           "remove_node")


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

    @property
    def reason(self) -> str:
        """Why not, as text (HAMi's "N/M Reason" for card counts): for bind errors and logs."""
        return self.reasons.text if self.reasons is not None else self.refused


class Ledger:
    def __init__(self, redis: Redis, prefix: str = "mt"):
        self.redis = redis
        self.prefix = prefix
        self.feed = f"{prefix}:feed"
        self.nodes_key = f"{prefix}:nodes"
        self.epoch_key = f"{prefix}:epoch"  # set by every rebuild; its absence means the state was lost
        lib = (LUA_DIR / "_lib.lua").read_text()
        self._src = {n: lib + "\n" + (LUA_DIR / f"{n}.lua").read_text() for n in SCRIPTS}
        self._sha = {n: hashlib.sha1(s.encode()).hexdigest() for n, s in self._src.items()}
        self.round_trips = 0  # counted for benchmarks: every call to Redis adds one
        self.connection_retries = 2  # sends again after a connection error (see _retry) ...
        self.retry_seconds = 3.0  # ... and keeps trying this long (a Sentinel failover takes seconds)

    def node_key(self, node: str) -> str:
        return f"{self.prefix}:{{{node}}}:node"

    async def load_scripts(self) -> None:
        for name, src in self._src.items():
            sha = await self.redis.script_load(src)
            assert sha == self._sha[name], f"script {name}: Redis returned {sha}"

    async def _retry(self, what: str, op: Callable[[], Awaitable[T]]) -> T:
        """One round trip, sent again on a connection error (at most `connection_retries` times).

        A pooled connection that died with a Redis restart fails once and then reconnects. Sending
        again is safe: every script is idempotent by pod uid (a reserve whose reply was lost answers
        the second time with the cards it booked), and so are SADD/SREM/SMEMBERS/EXISTS/SET.
        """
        failures = 0
        deadline = time.monotonic() + self.retry_seconds
        while True:
            self.round_trips += 1
            REDIS_ROUND_TRIPS.labels(what).inc()
            try:
                return await op()
            except (rexc.ConnectionError, rexc.TimeoutError, rexc.ReadOnlyError) as e:
                failures += 1
                # a few quick tries (a pooled connection that died), then more while a failover settles
                if failures > self.connection_retries and time.monotonic() > deadline:
                    raise
                log.warning("%s: %s; sending again (%d)", what, e, failures)
                if isinstance(e, rexc.ReadOnlyError):
                    # the server we reach was demoted to a replica (a VIP or DNS name that moved on): new
                    # connections find the new master
                    pool = getattr(self.redis, "connection_pool", None)
                    if pool is not None:
                        await pool.disconnect()
                await asyncio.sleep(min(0.5, 0.05 * (failures - 1)))

    async def _call(self, name: str, node: str, payload: Mapping[str, Any] | None = None) -> Any:
        args = (self.feed, node, orjson.dumps(payload or {}).decode())
        key = self.node_key(node)
        for attempt in (1, 2):
            try:
                return await self._retry(name, lambda: self.redis.evalsha(self._sha[name], 1, key, *args))
            except rexc.NoScriptError:
                if attempt == 2:
                    raise
                log.info("scripts missing in Redis (restarted or flushed?): reloading")
                await self.load_scripts()
            except rexc.ResponseError as e:
                raise LedgerError(f"{name} on {node}: {e}") from e
        raise AssertionError("unreachable")

    # -- inventory -----------------------------------------------------------------------------

    @staticmethod
    def _cards_payload(inv: Inventory) -> dict[str, Any]:
        return {"error": inv.error, "cards": [
            {"index": c.index, "capacity": c.capacity, "slice_limit": c.max_slices,
             "health": c.health}
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
            version = int(await self._call("upsert_node", inv.node, payload))
        except LedgerError:
            if added:  # refused input leaves no trace
                await self._retry("srem", lambda: self.redis.srem(self.nodes_key, inv.node))
            raise
        if version < 0:
            return version
        if not create:
            await self.list_node(inv.node)
        return version

    async def remove_node(self, node: str) -> bool:
        existed = bool(await self._call("remove_node", node))
        await self._retry("srem", lambda: self.redis.srem(self.nodes_key, node))
        return existed

    async def announce(self, node: str) -> None:
        """Tell every mirror to re-read `node` (a `rebuild` notice on the feed; no state changes)."""
        msg = orjson.dumps({"node": node, "version": 0, "kind": "rebuild"}).decode()
        await self._retry("publish", lambda: self.redis.publish(self.feed, msg))

    async def list_node(self, node: str) -> int:
        added: int = await self._retry("sadd", lambda: self.redis.sadd(self.nodes_key, node))
        return added

    async def nodes(self) -> list[str]:
        members: Awaitable[set[str]] = self._retry("smembers", lambda: self.redis.smembers(self.nodes_key))  # type: ignore[arg-type,return-value]
        return sorted(await members)

    # -- reservations --------------------------------------------------------------------------

    async def reserve(self, node: str, uid: str, cards: Sequence[int], mem: int, cores: int, slices: int,
                      model: int = 0, whole: bool = False, pod: str = "",
                      need: CardNeed | None = None) -> tuple[ReserveOutcome, NodeSnapshot | None]:
        """Check-and-book on the given cards. On conflict returns the node's fresh state too.

        With `need` (a Plan's), the script checks every card with the twin of shared.domain.fit.card_rule on
        exactly those terms; `model`/`whole` are the short form (accepts {model}, require idle)."""
        payload: dict[str, Any] = {"uid": uid, "cards": list(cards), "mem": mem, "cores": cores, "slices": slices,
                                   "model": model, "whole": whole, "pod": pod}
        if need is not None:
            payload.update(mem=need.memory, cores=need.cores, slices=need.slices, idle=need.require_idle,
                           deny=sorted(need.deny))
            if need.accepts is not None:
                payload["accepts"] = sorted(need.accepts)
        raw = await self._call("reserve", node, payload)
        out = orjson.loads(raw)
        if out["ok"]:
            got = tuple(int(x) for x in str(out["cards"]).split(",") if x)
            feed = out.get("feed")
            return ReserveOutcome(True, got, existing=bool(out.get("existing")),
                                  feed=feed if isinstance(feed, dict) else None), None
        snap = NodeSnapshot.from_json(out["node"]) if out.get("node") else None
        return ReserveOutcome(False, refused=str(out.get("reason", ""))), snap

    async def place(self, node: str, uid: str, plan: Plan, pod: str = "") -> tuple[ReserveOutcome,
                                                                                   NodeSnapshot | None]:
        """Send a plan (shared.domain.fit.plan_booking: the caller plans) to the atomic reserve script.

        Booked: the cards with their capacity (the plan's, when the script booked the planned cards).
        Refused: the reason and the node's fresh state, so the caller can plan again without a read. The
        replanning loop is shared.store.placing.place.
        """
        need = plan.need
        if need is None:
            raise ValueError(f"place on {node} for {uid}: the plan has no booking ({plan.reason})")
        outcome, fresh = await self.reserve(node, uid, plan.cards, need.memory, need.cores, need.slices, pod=pod,
                                            need=need)
        if outcome.ok and outcome.cards == plan.cards:
            outcome = ReserveOutcome(True, outcome.cards, existing=outcome.existing, capacity=plan.capacity,
                                     feed=outcome.feed)
        return outcome, fresh

    async def mark_bound(self, node: str, uid: str) -> bool:
        return bool(orjson.loads(await self._call("mark_bound", node, {"uid": uid}))["ok"])

    async def release(self, node: str, uid: str) -> bool:
        """Give a pod's share back; True if something was held. Idempotent."""
        return bool(orjson.loads(await self._call("release", node, {"uid": uid}))["released"])

    async def observe(self, uid: str, usage: PodUsage, pod: str = "", keep_bound: bool = False) -> dict[str, Any]:
        """Record the allocation a bound pod carries (idempotent); reports over-commit instead of hiding it.

        A node missing from Redis is refused ({"ok": false, "reason": "node missing"}), never created.
        `keep_bound`: a bound reservation that differs from `usage` stays as it is, answered with
        {"kept": true, "booked": {cards, mem, cores, slices}} (the record changed after our bind).
        """
        out: dict[str, Any] = orjson.loads(await self._call("observe", usage.node, {
            "uid": uid, "cards": list(usage.cards), "mem": usage.memory, "cores": usage.cores,
            "slices": usage.slices, "pod": pod, "keep_bound": keep_bound}))
        return out

    async def expire(self, node: str, ttl_seconds: float) -> list[str]:
        """Release pending reservations older than the TTL on one node; returns their uids."""
        return list(orjson.loads(await self._call("expire", node, {"ttl_ms": int(ttl_seconds * 1000)})))

    # -- reads ---------------------------------------------------------------------------------

    async def snapshot(self, node: str) -> NodeSnapshot | None:
        d = orjson.loads(await self._call("snapshot", node))
        return NodeSnapshot.from_json(d) if d.get("exists") else None

    async def snapshots(self, nodes: Iterable[str]) -> dict[str, NodeSnapshot]:
        """Many nodes in one round trip (pipelined)."""
        names = list(nodes)
        if not names:
            return {}

        async def read() -> list[Any]:
            pipe = self.redis.pipeline(transaction=False)
            for n in names:
                pipe.evalsha(self._sha["snapshot"], 1, self.node_key(n), self.feed, n, "{}")
            return await pipe.execute()

        for attempt in (1, 2):
            try:
                raws = await self._retry("snapshots", read)
                break
            except rexc.NoScriptError:
                if attempt == 2:
                    raise
                await self.load_scripts()
        out = {}
        for raw in raws:
            d = orjson.loads(raw)
            if d.get("exists"):
                snap = NodeSnapshot.from_json(d)
                out[snap.node] = snap
        return out

    # -- rebuild -------------------------------------------------------------------------------

    async def replace_node(self, inv: Inventory, bound: Mapping[str, tuple[PodUsage, str]],
                           keep_ms: int | None = None, keep_bound: bool = False,
                           keep_from: int | None = None) -> dict[str, Any]:
        """Atomically set one node to what the API implies: its cards and its bound pods' usage.

        Pending reservations, and those made or bound in the last `keep_ms` ms of Redis time (newer
        than the caller's truth), are kept if they fit. `keep_bound`: a pod of `bound` whose
        reservation is bound keeps that booking where its record differs; their uids come back as
        "kept_bound" (a list).
        """
        payload = self._cards_payload(inv)
        if keep_ms is not None:
            payload["keep_ms"] = max(0, int(keep_ms))
        if keep_from is not None:
            payload["keep_from"] = max(0, int(keep_from))
        payload["keep_bound"] = keep_bound
        payload["bound"] = [
            {"uid": uid, "cards": list(u.cards), "mem": u.memory, "cores": u.cores, "slices": u.slices,
             "pod": pod}
            for uid, (u, pod) in sorted(bound.items())]
        out: dict[str, Any] = orjson.loads(await self._call("replace_node", inv.node, payload))
        out["kept_bound"] = list(out.get("kept_bound") or [])  # cjson sends an empty list as {}
        return out

    async def rebuild(self, inventories: Iterable[Inventory],
                      bound: Mapping[str, tuple[PodUsage, str]],
                      keep_ms: int | None = None, keep_bound: bool = False) -> dict[str, int]:
        """Recompute the whole ledger from the API server's truth (nodes + bound pods' annotations).

        Node by node, each an atomic replace, so no replica ever reads a node empty or doubled;
        nodes that no longer exist are removed last, unless a pod still holds cards there.
        `keep_bound`: see replace_node (a rebuild over state Redis still has keeps what our bind booked).
        """
        by_node: dict[str, dict[str, tuple[PodUsage, str]]] = {}
        for uid, (usage, pod) in bound.items():
            by_node.setdefault(usage.node, {})[uid] = (usage, pod)
        seen = set()
        stats = {"nodes": 0, "bound": 0, "pending_kept": 0, "pending_dropped": 0, "removed": 0, "kept_bound": 0}
        for inv in inventories:
            seen.add(inv.node)
            await self.list_node(inv.node)  # listed first, see upsert_node
            out = await self.replace_node(inv, by_node.get(inv.node, {}), keep_ms, keep_bound)
            stats["nodes"] += 1
            stats["kept_bound"] += len(out["kept_bound"])
            stats["bound"] += int(out["bound"])
            stats["pending_kept"] += int(out["pending_kept"])
            stats["pending_dropped"] += int(out["pending_dropped"])
        for node in (set(by_node) - seen):
            # A node the API no longer reports while its pods still hold cards (deleted, or its capacity
            # went to 0): keep their usage on placeholder cards, so it is there if the node comes back.
            await self.list_node(node)
            out = await self.replace_node(Inventory(node), by_node[node], keep_ms, keep_bound)
            stats["kept_bound"] += len(out["kept_bound"])
            seen.add(node)
        for node in set(await self.nodes()) - seen:
            await self.remove_node(node)
            stats["removed"] += 1
        await self._retry("set", lambda: self.redis.set(self.epoch_key, str(now_ms())))
        return stats

    async def redis_time_ms(self) -> int:
        """Redis's clock: the one every reservation's `created` and `bound_at` are stamped with."""
        sec, usec = await self._retry("time", lambda: self.redis.time())
        return int(sec) * 1000 + int(usec) // 1000

    async def intact(self) -> bool:
        """False once Redis lost the state a rebuild wrote (restart without persistence, FLUSHALL)."""
        return bool(await self._retry("exists", lambda: self.redis.exists(self.epoch_key)))


def now_ms() -> int:
    return int(time.time() * 1000)
