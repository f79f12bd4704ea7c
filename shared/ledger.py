"""The Ledger: shared per-card state in Redis, changed only by atomic Lua scripts.

Every change is one script on one node's keys (one hash tag per node, so it also works on Redis
Cluster), idempotent by pod UID. Redis is rebuildable state: the API server's pod annotations are
the durable record, and `rebuild` recomputes everything from them. Scripts live in shared/lua/,
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
from urllib.parse import parse_qs, unquote, urlparse

import orjson
from redis import exceptions as rexc
from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, ClusterPipeline, RedisCluster
from redis.asyncio.connection import Connection as RedisConnection
from redis.asyncio.connection import ConnectionPool

from shared.annotations import PodUsage
from shared.config import Config, redis_password
from shared.fit import CardNeed, FitResult, plan_booking
from shared.metrics import REDIS_ROUND_TRIPS
from shared.node import Inventory
from shared.request import SliceRequest
from shared.state import NodeSnapshot

log = logging.getLogger("mtsched.ledger")
T = TypeVar("T")
LUA_DIR = Path(__file__).with_name("lua")
SCRIPTS = ("upsert_node", "reserve", "mark_bound", "release", "observe", "expire", "snapshot", "replace_node",
           "remove_node")


class LedgerError(RuntimeError):
    """A script refused its input (BADINPUT) or Redis failed; state is unchanged."""


@dataclass(frozen=True)
class RedisOptions:
    """What a client needs besides its URL: the password (when the URL carries none) and, for rediss://,
    the CA that signed the server's certificate and a client certificate (tls-auth-clients)."""

    password: str | None = field(default=None, repr=False)
    ca_file: str | None = None
    ca_data: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    @classmethod
    def from_config(cls, cfg: Config) -> RedisOptions:
        """From redisPassword / redisPasswordFile (read now) and redisCAFile, redisCA, redisCertFile,
        redisKeyFile; ConfigError if the password file cannot be read."""
        return cls(redis_password(cfg), cfg.redis_ca_file or None, cfg.redis_ca or None,
                   cfg.redis_cert_file or None, cfg.redis_key_file or None)

    @property
    def tls(self) -> dict[str, str]:
        """redis-py's ssl_* arguments; the system's CAs stay trusted as well (redis-py's default context)."""
        out = {"ssl_ca_certs": self.ca_file, "ssl_ca_data": self.ca_data, "ssl_certfile": self.cert_file,
               "ssl_keyfile": self.key_file}
        return {k: v for k, v in out.items() if v}


NO_OPTIONS = RedisOptions()


def connect(url: str, options: RedisOptions = NO_OPTIONS) -> Redis:
    """A client from a URL: redis://[:password@]host:port/db, rediss:// (TLS), unix:///path?db=0,
    redis+sentinel://[:password@]host:port[,host:port]/service[/db][?sentinel_password=...],
    redis+cluster://[:password@]host:port[,host:port].

    `options.password` is used wherever the URL carries no password (every form); the TLS options
    need rediss:// (ValueError otherwise: they would be ignored, and the connection sent in clear).
    Sentinel: the client asks the sentinels for the master on every new connection, so after a
    failover it reconnects to the new one (READONLY from a demoted master is turned into a
    ConnectionError by redis-py's Sentinel connection, which the ledger sends again). The password
    is used for the data nodes and, unless `sentinel_password` says otherwise (empty: none), for
    the sentinels.
    Cluster: a RedisCluster (every ledger script names its node key first, so it is routed by the
    node's hash tag). For the feed's Pub/Sub connection use `connect_subscriber`.
    """
    if options.tls and not url.startswith("rediss://"):
        raise ValueError("a CA or client certificate for Redis needs a rediss:// URL")
    if url.startswith("redis+sentinel://"):
        return _connect_sentinel(url, options.password)
    if url.startswith("redis+cluster://"):
        hosts, username, password, _path, _query = _split_ha_url(url, 6379)
        return _Cluster(startup_nodes=[ClusterNode(h, p) for h, p in hosts],  # type: ignore[return-value]
                        username=username, password=password or options.password, decode_responses=True)
    # redis-py lets the URL's own password (and ssl_* query options) win over these arguments
    extra: dict[str, Any] = {"password": options.password} if options.password else {}
    extra.update(options.tls)
    return Redis.from_url(url, decode_responses=True, **extra)


def connect_subscriber(url: str, options: RedisOptions = NO_OPTIONS) -> Redis:
    """The client a Mirror subscribes to the feed with (Mirror(ledger, subscriber=...)).

    For redis+cluster:// a plain client on one cluster node at a time: classic PUBLISH reaches every
    node of a cluster, so any node serves the feed. (redis-py's RedisCluster.pubsub() would pin the
    connection to the node owning the channel name's slot, and come back to it while it is down.)
    Each new connection goes to the first node that answers, the last one that did first, and learns
    the cluster's other nodes (CLUSTER NODES), so the feed survives the death of any node. For the
    other URL forms: connect(url, options) (with Sentinel the subscription follows the master).
    """
    if not url.startswith("redis+cluster://"):
        return connect(url, options)
    hosts, username, password, _path, _query = _split_ha_url(url, 6379)
    # A short connect timeout: a node that does not answer is skipped for the next one.
    pool = ConnectionPool(connection_class=_AnyClusterNode, nodes=_NodeList(hosts), username=username,
                          password=password or options.password, decode_responses=True,
                          socket_connect_timeout=2.0)
    return Redis.from_pool(pool)


def explain(error: BaseException) -> str:
    """A Redis connection failure in words that say what to configure (never the password)."""
    cause: BaseException | None = error
    while cause is not None and not isinstance(cause, rexc.AuthenticationError):
        cause = cause.__cause__  # RedisCluster wraps the node's refusal in a RedisClusterException
    text = str(cause or error)
    if cause is not None:
        if "invalid username-password pair" in text or "WRONGPASS" in text:
            return f"Redis refused the password (wrong password or user): {text}"
        return (f"Redis requires a password and none was given (set redisPasswordFile, or "
                f"MTSCHED_REDIS_PASSWORD): {text}")
    if "CERTIFICATE_VERIFY_FAILED" in text:
        return f"Redis's TLS certificate is not trusted (set redisCAFile to the CA that signed it): {text}"
    if "AuthenticationError" in text:  # Sentinel's MasterNotFoundError names the sentinels' own errors only
        return (f"the sentinels refused the credentials (no password or a wrong one: redisPasswordFile, "
                f"MTSCHED_REDIS_PASSWORD, or ?sentinel_password= when they have their own): {text}")
    return f"{type(error).__name__}: {text}"


def _split_ha_url(url: str, default_port: int) -> tuple[list[tuple[str, int]], str | None, str | None, list[str],
                                                         dict[str, list[str]]]:
    """(hosts, username, password, path parts, query) of a redis+sentinel:// or redis+cluster:// URL."""
    u = urlparse("redis://" + url.split("://", 1)[1])
    hosts = []
    for h in u.netloc.rsplit("@", 1)[-1].split(","):
        host, sep, port = h.rpartition(":")
        hosts.append((host, int(port)) if sep and port.isdigit() else (h, default_port))
    if not hosts or not all(h for h, _p in hosts):
        raise ValueError(f"{url.split('://', 1)[0]}:// URL names no host")
    return (hosts, unquote(u.username) if u.username else None, unquote(u.password) if u.password else None,
            [p for p in u.path.split("/") if p], parse_qs(u.query, keep_blank_values=True))


def _connect_sentinel(url: str, default_password: str | None) -> Redis:
    from redis.asyncio.retry import Retry
    from redis.asyncio.sentinel import Sentinel
    from redis.backoff import NoBackoff

    hosts, username, password, parts, query = _split_ha_url(url, 26379)
    password = password or default_password
    if not parts:
        raise ValueError("redis+sentinel:// URL needs the service name: redis+sentinel://host:26379/mymaster")
    # The sentinels use the data nodes' credentials unless the URL gives them a password of their own.
    sentinel_user, sentinel_password = username, password
    if "sentinel_password" in query:
        sentinel_user, sentinel_password = None, query["sentinel_password"][-1] or None
    # A sentinel that does not answer (or refuses AUTH, a ConnectionError in redis-py) is skipped for
    # the next one at once: short timeouts and no retries of its own (redis-py's default retries ten
    # times with backoff, which stalled each master lookup for seconds).
    sentinel_kwargs = {"username": sentinel_user, "password": sentinel_password, "socket_timeout": 2.0,
                       "socket_connect_timeout": 2.0, "retry": Retry(NoBackoff(), 0)}
    sentinel = Sentinel(hosts, sentinel_kwargs=sentinel_kwargs, username=username, password=password,
                        decode_responses=True)  # type: ignore[no-untyped-call]
    return sentinel.master_for(parts[0], redis_class=_SentinelMaster,  # type: ignore[no-any-return]
                               db=int(parts[1]) if len(parts) > 1 else 0)


class _SentinelMaster(Redis):
    """The master's client from Sentinel.master_for; closing it also closes the sentinel connections."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        manager = getattr(self.connection_pool, "sentinel_manager", None)
        if manager is not None:
            await manager.aclose()


class _Cluster(RedisCluster):
    """RedisCluster whose pipelines run EVALSHA (Ledger.snapshots reads many nodes in one go)."""

    def pipeline(self, transaction: Any | None = None, shard_hint: Any | None = None) -> ClusterPipeline:
        if shard_hint:
            raise ValueError("shard_hint is not supported in cluster mode")
        return _ClusterPipeline(self, transaction)  # type: ignore[abstract]  # as RedisCluster.pipeline does


class _ClusterPipeline(ClusterPipeline):
    """redis-py blocks EVALSHA in cluster pipelines, as a script's keys could span slots. Ours name
    their node key first and touch only keys of that node's hash tag, so EVALSHA is routed by it
    like any keyed command (NOSCRIPT still comes back as NoScriptError)."""

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:
        return self.execute_command("EVALSHA", sha, numkeys, *keys_and_args)


class _NodeList:
    """Addresses of a cluster's nodes, shared by a subscriber's connections; the last that answered first."""

    def __init__(self, seeds: Sequence[tuple[str, int]]):
        self.addresses = list(dict.fromkeys(seeds))

    def answered(self, address: tuple[str, int]) -> None:
        self.addresses.remove(address)
        self.addresses.insert(0, address)

    def learn(self, cluster_nodes: str, via: str) -> None:
        """Add the nodes a CLUSTER NODES reply lists (`via`: the host it came from, for "myself" without one)."""
        for line in cluster_nodes.splitlines():
            f = line.split()
            if len(f) < 3 or any(flag in f[2] for flag in ("noaddr", "handshake")):
                continue
            host, _, port = f[1].split("@", 1)[0].rpartition(":")
            if port.isdigit() and int(port) and (host or via, int(port)) not in self.addresses:
                self.addresses.append((host or via, int(port)))


class _AnyClusterNode(RedisConnection):
    """A connection to whichever node of the cluster answers first (see connect_subscriber)."""

    def __init__(self, *, nodes: _NodeList, **kwargs: Any):
        self.nodes = nodes
        super().__init__(**kwargs)

    async def _connect(self) -> None:
        error: BaseException = OSError("no cluster node to connect to")
        for address in list(self.nodes.addresses):
            self.host, self.port = address
            try:
                await super()._connect()  # type: ignore[no-untyped-call]
            except (TimeoutError, OSError) as e:
                error = e
                continue
            self.nodes.answered(address)
            return
        raise error

    async def on_connect_check_health(self, check_health: bool = True) -> None:
        await super().on_connect_check_health(check_health)
        await self.send_command("CLUSTER", "NODES", check_health=False)
        self.nodes.learn(str(await self.read_response()), self.host)


@dataclass(frozen=True)
class ReserveOutcome:
    ok: bool
    cards: tuple[int, ...] = ()
    reason: str = ""
    existing: bool = False
    attempts: int = 1
    round_trips: int = 1


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

        With `need` (a Plan's), the script checks every card with the twin of shared.fit.card_rule on
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
            return ReserveOutcome(True, got, existing=bool(out.get("existing"))), None
        snap = NodeSnapshot.from_json(out["node"]) if out.get("node") else None
        return ReserveOutcome(False, reason=str(out.get("reason", ""))), snap

    async def place(self, node: str, uid: str, req: SliceRequest, annotations: Mapping[str, str],
                    snapshot: NodeSnapshot | None, gpu_policy: str, pod: str = "",
                    max_attempts: int = 3) -> tuple[ReserveOutcome, FitResult | None]:
        """Fit `req` on the node (from a mirror's snapshot) and book it atomically; refit on conflict.

        One round trip when the mirror is current; each conflict costs one more (the script returns
        the fresh state with its refusal, so no extra read is needed).
        """
        trips = 0
        result: FitResult | None = None
        for attempt in range(1, max_attempts + 1):
            if snapshot is None:
                snapshot = await self.snapshot(node)
                trips += 1
                if snapshot is None:
                    return ReserveOutcome(False, reason="node unregistered", attempts=attempt,
                                          round_trips=trips), None
            if snapshot.error:
                return ReserveOutcome(False, reason=f"node unregistered: {snapshot.error}", attempts=attempt,
                                      round_trips=trips), None
            existing = snapshot.reservations.get(uid)
            need = None
            if existing is not None and existing.cards:
                # Idempotent retry: the script returns the cards already booked, whatever a new fit says.
                result = FitResult(existing.cards)
                chosen = existing.cards
                mem, cores, slices = existing.mem, existing.cores, existing.slices
            else:
                plan = plan_booking(snapshot.card_states(), req, annotations, gpu_policy)
                result = FitResult(plan.cards, plan.reason)
                if not plan.ok or plan.need is None:
                    return (ReserveOutcome(False, reason=plan.reason, attempts=attempt, round_trips=trips),
                            result)
                chosen, need = plan.cards, plan.need
                mem, cores, slices = need.memory, need.cores, need.slices
            outcome, fresh = await self.reserve(node, uid, chosen, mem, cores, slices, pod=pod, need=need)
            trips += 1
            if outcome.ok:
                if outcome.cards != result.cards:  # booked earlier on other cards (our snapshot was stale)
                    result = FitResult(outcome.cards)
                return ReserveOutcome(True, outcome.cards, existing=outcome.existing, attempts=attempt,
                                      round_trips=trips), result
            log.debug("reserve conflict on %s for %s: %s (attempt %d)", node, uid, outcome.reason, attempt)
            snapshot = fresh
        return ReserveOutcome(False, reason=f"conflict: {outcome.reason}", attempts=max_attempts,
                              round_trips=trips), result

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
                           keep_ms: int | None = None, keep_bound: bool = False) -> dict[str, Any]:
        """Atomically set one node to what the API implies: its cards and its bound pods' usage.

        Pending reservations, and those made or bound in the last `keep_ms` ms of Redis time (newer
        than the caller's truth), are kept if they fit. `keep_bound`: a pod of `bound` whose
        reservation is bound keeps that booking where its record differs; their uids come back as
        "kept_bound" (a list).
        """
        payload = self._cards_payload(inv)
        if keep_ms is not None:
            payload["keep_ms"] = max(0, int(keep_ms))
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
