"""The Ledger's reads of many nodes: snapshots and (version, stamp) heads in pipelined batches that never hold the
caller's event loop for long, a mirror's re-read that skips decoding what it already holds, and reads around a
Cluster slot being moved."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import orjson
from redis import exceptions as rexc
from redis.asyncio.cluster import RedisCluster

from shared.domain.state import NodeSnapshot
from shared.store.keys import CLEAR, DAMAGED, MOREKEYS
from shared.store.ledger_core import KEY_ROUNDS, LedgerCore, LedgerError, failed, log, said_damaged, wrong_type
from shared.store.resend import RESEND_OR_REDIRECT, resendable, slot_moving

# Nodes per pipelined read: packing, parsing and decoding one reply holds the caller's event loop, so a
# read of 5,000 nodes (a mirror's resync, a reconcile pass) is cut where the loop can serve requests.
SNAPSHOT_BATCH = 250
HEADS_BATCH = 1000  # nodes per pipelined read of (version, stamp): two short fields each


@dataclass(frozen=True)
class Reread:
    """What Ledger.reread read: the snapshots of the nodes that exist and were decoded, the nodes whose reply
    was the text `previous` named (not decoded), and each reply's digest (also of nodes that do not exist).
    `moving` (with `isolate`): the nodes that could not be read for a live reshard of their slot (slot_moving)."""

    snaps: dict[str, NodeSnapshot]
    unchanged: set[str]
    digests: dict[str, int]
    moving: set[str] = field(default_factory=set)


class LedgerReads(LedgerCore):
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
                # a node hash of another type (an edit: WRONGTYPE) names no write, as one that is not a number: the
                # node is read, and its snapshot clears it (_lib.lua: clear_damage); it failed the whole read before
                raws = [[-1, ""] if _wrong_type(r) else r for r in await pipe.execute(raise_on_error=False)]
                if (error := next((r for r in raws if isinstance(r, Exception)), None)) is not None:
                    raise error
                return raws

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
        clear: set[str] = set()  # nodes that met WRONGTYPE: read again clearing their keys of another type
        for _ in range(KEY_ROUNDS + 1):
            if not todo:
                break
            batch = [(n, self.keys.snapshot(n, self.known(n))) for n in todo]

            async def read(batch: list[tuple[str, list[str]]] = batch) -> list[Any]:
                def queue() -> Any:
                    pipe = self.redis.pipeline(transaction=False)
                    for n, keys in batch:
                        more = (CLEAR,) if n in clear else ()
                        pipe.evalsha(script.sha, len(keys), *keys, self.feed, n, "{}", *more)
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
                elif wrong_type(raw):
                    todo.append(n)
                    clear.add(n)
                elif isinstance(raw, rexc.ResponseError) and str(raw).startswith(DAMAGED):
                    todo.append(n)  # its keys of another type deleted: read again, as missing
                    clear.discard(n)
                    said_damaged("snapshot", n, str(raw))
                elif isinstance(raw, Exception):
                    raise failed(f"snapshot of {n}", raw) from raw
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


def _wrong_type(raw: Any) -> bool:
    return isinstance(raw, rexc.ResponseError) and str(raw).startswith("WRONGTYPE")


def _failed(raw: Any) -> bool:
    """A pipelined command that failed for want of Redis (connection, cluster down), not by its script."""
    return isinstance(raw, Exception) and (not isinstance(raw, rexc.ResponseError)
                                           or isinstance(raw, rexc.ClusterError | rexc.TryAgainError))
