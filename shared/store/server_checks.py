"""What the Ledger asks of the Redis server itself rather than of a node's keys: its clocks (the watchers' upkeep
stamp, each shard's clock), whether it can take the bookings (a write, the history token the fence reads, an
eviction policy that may drop ledger keys), the risk a Sentinel master poses when cut off, and whether the state
a rebuild wrote is still there."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Iterable
from typing import Any, cast

from redis import exceptions as rexc
from redis.asyncio.cluster import RedisCluster

from shared.serving.metrics import REDIS_EVICTED_KEYS
from shared.store.eviction import eviction_refusal, evicts_ledger
from shared.store.ledger_core import LedgerCore, LedgerError, log
from shared.store.redis_conn import is_sentinel
from shared.store.resend import RESEND

# for the readiness probe: whether INFO holds both parts of the history token the scripts read (`server_info` in
# _lib.lua); "" when either is missing
RUN_ID_SCRIPT = ("return (string.match(redis.call('INFO', 'server'), 'run_id:(%x+)') "
                 "and string.match(redis.call('INFO', 'replication'), 'master_replid:(%x+)')) or ''")


class ServerChecks(LedgerCore):
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
