"""A replica's local read-only copy of the ledger, kept current by the change feed.

Every ledger script publishes the cards it changed (all of the node's cards after an upsert or a
rebuild, flagged full) and the reservation it changed (a batched confirmation: several, counting one
version each), with the node's new version, on `<prefix>:feed`. The mirror applies a message when its version is the
next one it expects; on a gap, an unknown node or a rebuild it re-reads that node (one round
trip). On (re)connect it re-reads everything in one pipelined round trip, and it re-reads
everything periodically as a safety net, since Pub/Sub drops messages while disconnected.
So filtering 500 nodes costs no Redis read at all.

Each change replaces the node's snapshot whole with a new immutable one, which carries the next `seq`
(shared/domain/state.py): what is derived from a snapshot is keyed by (node, seq).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

import orjson
from redis import exceptions as rexc
from redis.asyncio import Redis

from shared.domain.node import mismatch_kind
from shared.domain.state import CardRecord, NodeSnapshot, Reservation
from shared.serving.metrics import FEED_SILENCES, MIRROR_FULL_READS, MIRROR_MOVING, MIRROR_REREADS
from shared.serving.supervise import Backoff, cancel_and_wait
from shared.store.ledger import MARK_BOUND_MAX, NOTICES, RESEND, Ledger, slot_moving
from shared.store.redis_conn import credentials_refused, explain, master_replaced

try:  # the sentinel redis-py's hiredis parser has its reader return when no whole reply is buffered
    from redis._parsers.hiredis import NOT_ENOUGH_DATA as _NOT_ENOUGH_DATA
except ImportError:  # another redis-py: buffered_messages takes nothing
    _NOT_ENOUGH_DATA = None

log = logging.getLogger("mtsched.mirror")
# Redis lost (or a cluster without a master for a while): resubscribe and re-read, after a backoff
LOST: tuple[type[BaseException], ...] = (*RESEND, OSError)
STOP_GRACE_SECONDS = 5.0  # stop(): how long a task that does not heed its cancel is waited for
# How soon nodes that could not be read while their Cluster slot moves (`Mirror.moving`) are read again: after
# MOVING_RETRY_SECONDS, then twice as long each time they still cannot be, up to MOVING_RETRY_MAX_SECONDS (a read
# of a moving node holds the mirror's loop for redis-py's tries, ~0.4 s: a move held for long costs the loop a few
# per cent, and a node is offered again at most MOVING_RETRY_MAX_SECONDS after its move ended)
MOVING_RETRY_SECONDS = 1.0
MOVING_RETRY_MAX_SECONDS = 8.0


def _all(fn: Callable[[Any], None], items: list[Any]) -> None:
    """fn on every item, even when it raises on some: then the first error is raised at the end."""
    first: Exception | None = None
    for item in items:
        try:
            fn(item)
        except Exception as e:  # raised again below
            first = first or e
    if first is not None:
        raise first


# Every how many periodic resyncs every node is read, not only those whose last write is not the one held:
# 10 x 30 s, the bound on how long a mirror can show something no feed message or write explains
FULL_EVERY = 10


# How long the feed connection may stay silent before the mirror PINGs on it, and how long it then waits for the
# pong before it takes the connection for dead: a socket that died without a reset (a peer or a route gone, a
# NAT's entry dropped) reads nothing and raises nothing, so without this the mirror would stay "ready" on a feed
# that no longer comes, current only through its periodic resyncs. Reconnecting re-reads everything.
FEED_SILENCE_SECONDS = 10.0
# A feed connection counts as working (the backoff of the next loss starts over) once it has stayed up this long
# after the re-read that followed its (re)subscribe: one that Redis drops again at once (its pubsub output buffer
# limit, a proxy) was re-read whole 0.2 s after each loss, on every replica
# (tests/redis/test_redteam_flood_feed_reconnect.py)
FEED_WORKS_SECONDS = 5.0


class FeedSilent(rexc.ConnectionError):
    """The feed connection answered no PING in time (Mirror.silence_seconds)."""


class FeedDeposed(rexc.ConnectionError):
    """The feed connection reaches a master the sentinels have replaced (redis_conn.master_replaced): one cut off
    from them and its replicas, which they could not demote, answers its PINGs and publishes nothing of what is
    written on the master they promoted (tests/redis_ha/test_redteam_sentinel_deposed.py)."""


# Feed messages that never change a node's error or the capacities of its cards: a booking and its
# confirmation (a release may drop a removed card, an observe add one; neither is a capacity either, but they are
# rare and applied whole)
BOOKINGS = frozenset({"reserve", "bound"})


async def buffered_messages(pubsub: Any, on_reply: Callable[[], None] | None = None) -> AsyncIterator[Any]:
    """The data of the feed messages the subscriber connection has already read and parsed, in order,
    without waiting for more.

    Under load the feed's messages arrive several to a socket read, and redis-py's `get_message` takes each
    through its command layers (health check, retry wrapper, timeout, message dict): measured by CPU-time
    sampling in a burst, that was half the feed's cost, and the feed was 39 % of the watcher's CPU and 21 %
    of the webhook's. Here the replies already parsed by hiredis are taken straight from its reader. Anything
    but a channel message (a subscription's confirmation, a health check's pong) goes through redis-py's own
    `handle_message`, so its bookkeeping stays as it is; an error reply is raised as `read_response` raises it.
    Without the hiredis parser (another redis-py) nothing is taken here: `get_message` reads every message.
    `on_reply` is called for each other reply taken here (a pong, in whatever form: a sign of life)."""
    parser = getattr(getattr(pubsub, "connection", None), "_parser", None)
    gets = getattr(getattr(parser, "_reader", None), "gets", None)
    if gets is None or _NOT_ENOUGH_DATA is None:
        return
    while getattr(parser, "_connected", False):  # as read_response: nothing more once disconnected
        reply = gets()
        if reply is _NOT_ENOUGH_DATA:  # no complete reply buffered
            return
        if isinstance(reply, BaseException):
            raise reply
        if isinstance(reply, list) and len(reply) == 3 and reply[0] in (b"message", "message"):
            yield reply[2]
            continue
        message = await pubsub.handle_message(reply, ignore_subscribe_messages=True)
        if isinstance(message, dict) and message.get("type") == "message":
            yield message["data"]
        elif on_reply is not None:
            on_reply()


class Mirror:
    def __init__(self, ledger: Ledger, subscriber: Redis | None = None, resync_seconds: float = 30.0,
                 shapes_only: bool = False, silence_seconds: float = FEED_SILENCE_SECONDS):
        """`shapes_only`: the role reads only capacities() and mismatched() (the webhook). A booking then
        moves the node's (version, stamp) here without decoding its cards or reservation: the snapshot's
        usage is left as it was (stale) until a full resync, at most FULL_EVERY periods later. Every other
        message, and every resync, is applied as without it."""
        self.shapes_only = shapes_only
        self.silence_seconds = silence_seconds  # FEED_SILENCE_SECONDS
        self.pings = 0  # liveness PINGs sent on the feed connection
        self.silences = 0  # feed connections given up for answering no PING in time
        self._heard = 0.0  # when the feed connection last brought anything (loop time)
        self._pinged: float | None = None  # when the outstanding liveness PING was sent, if one is
        self.ledger = ledger
        self.subscriber = subscriber or ledger.redis
        self.resync_seconds = resync_seconds
        self.nodes: dict[str, NodeSnapshot] = {}
        self.ready = asyncio.Event()
        self.refetches = 0
        self._why = ""  # why apply asked for the last re-read (counted in MIRROR_REREADS when it is done)
        self.applied = 0
        self.buffered = 0  # feed messages taken from what the connection had already read (buffered_messages)
        self.on_change: list[Callable[[str], None]] = []
        self.on_reconnect: list[Callable[[], None]] = []  # after a re-read following a lost connection
        # a notice (Ledger.notify) for a node the mirror holds, by kind: wake, verify
        self.on_notice: dict[str, list[Callable[[str], None]]] = {kind: [] for kind in NOTICES}
        self.on_first_sync: list[Callable[[], None]] = []  # once, after the first full read
        self._task: asyncio.Task[None] | None = None
        self._reconnected = False
        self._subscribed_once = False
        self._shapes: dict[str, tuple[str, frozenset[int]]] = {}  # node -> (error, card capacities): `_track`
        self._derived: tuple[frozenset[int], Mapping[str, str]] | None = None  # `_views`; None: derive again
        # node -> digest of the ledger's reply its snapshot was decoded from (Ledger.reread), while nothing else
        # changed the node here: a resync skips decoding a reply with the same digest
        self._digests: dict[str, int] = {}
        # while a resync reads: node -> the snapshots a message was applied onto here meanwhile (`apply`), so the
        # resync keeps such a node's newer snapshot only when it was built on what the read found
        self._bases: dict[str, list[NodeSnapshot]] | None = None
        # nodes whose Redis Cluster slot a live reshard is moving between shards (Ledger.reread `isolate`, a failed
        # script: note_moving): Redis runs no booking on them until the move ends; their last snapshot is kept,
        # the extender offers none of them, and their slot is asked again (Ledger.slot_open) with a backoff
        # (MOVING_RETRY_SECONDS...). The mirror stays ready: every other node is served (before, one such node
        # made the whole mirror unready)
        self.moving: frozenset[str] = frozenset()
        self._moving_at = 0.0  # loop time when the moving nodes are read again (`_run`)
        self._moving_wait = MOVING_RETRY_SECONDS  # the wait before that read, doubled while they stay moving
        ledger.on_moving.append(self.note_moving)  # any script of this role that failed for a move tells it
        self.resyncs = 0
        self.read = 0  # nodes a resync read (the others' last write was the one held here)
        self.decoded = 0  # replies a resync decoded (the others were the text last read)

    def get(self, node: str) -> NodeSnapshot | None:
        return self.nodes.get(node)

    def owner_of(self, uid: str, hint: str | None = None) -> str | None:
        """Node holding a reservation for this pod uid (watchers release by uid). `hint`, the node the pod
        is bound to, is looked at first: then a release costs one lookup, not one per node."""
        if hint:
            snap = self.nodes.get(hint)
            if snap is not None and uid in snap.reservations:
                return hint
        for name, snap in self.nodes.items():
            if uid in snap.reservations:
                return name
        return None

    @property
    def synced_once(self) -> bool:
        """Whether it has read the whole state at least once (what a role serving from memory needs)."""
        return self._subscribed_once

    def capacities(self) -> frozenset[int]:
        """Per-card capacities reported by the cluster's usable cards (the webhook's mixed-fleet input)."""
        return self._views()[0]

    def mismatched(self) -> Mapping[str, str]:
        """Nodes that report sliced cards but offer none because their capacity, label or card model disagrees
        with the configuration, and why (the webhook's admission warning)."""
        return self._views()[1]

    def _views(self) -> tuple[frozenset[int], Mapping[str, str]]:
        """capacities() and mismatched(), derived again only when some node's error or card capacities
        changed (`_track`): the webhook asks for both on every review, and a booking changes neither, so a
        burst does not rescan every card of 5,000 nodes per pod."""
        if self._derived is None:
            caps = frozenset(c for err, cs in self._shapes.values() if not err for c in cs)
            mismatched = MappingProxyType({n: err for n, (err, _) in self._shapes.items() if mismatch_kind(err)})
            self._derived = (caps, mismatched)
        return self._derived

    def _track(self, node: str) -> None:
        """Keep the node's (error, card capacities) for `_views`; a change of either invalidates them."""
        snap = self.nodes.get(node)
        shape = None if snap is None else (snap.error, snap.capacities)
        if self._shapes.get(node) != shape:
            if shape is None:
                self._shapes.pop(node, None)
            else:
                self._shapes[node] = shape
            self._derived = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="mirror")

    async def run(self) -> None:
        """The mirror's loop, for a supervisor to run (start() runs it as a task of its own)."""
        await self._run()

    async def stop(self) -> None:
        """End start()'s task: cancelled again until it ends (a cancel can be lost), at most STOP_GRACE_SECONDS."""
        if self._task:
            if await cancel_and_wait([self._task], STOP_GRACE_SECONDS):
                log.error("the mirror's task did not end %.1fs after its cancel: left behind", STOP_GRACE_SECONDS)
            elif not self._task.cancelled():
                self._task.result()  # (an error it ended with is raised here, as before)

    async def resync(self, full: bool = False, only: Iterable[str] | None = None) -> None:
        """Read the ledger again, as a safety net for feed messages lost or misapplied.

        Periodically, only the nodes whose last write (version, stamp: `Ledger.heads`, one HMGET each) is not
        the one the mirror's snapshot comes from are read (the feed missed a write, a node is new, gone or
        was written anew after a loss or a failover); every FULL_EVERY-th resync reads every node, which also
        catches what no script wrote (the reconciler repairs such drift, and its repair is a write). `full`
        (after (re)subscribing) reads and decodes everything. A reply that is the very text last read for a
        node, which nothing changed here since, is not decoded again (`_digests`). `only`: these nodes alone
        (the moving ones, read again between periodic resyncs; not counted as one)."""
        if full:
            self._digests.clear()
        if only is None:
            self.resyncs += 1
        names = await self.ledger.nodes()
        todo = names
        if only is not None:
            wanted = set(only)
            todo = [n for n in names if n in wanted]
        elif not full and self.resyncs % FULL_EVERY:
            # (a moving node is read anyway: its version is not asked, which may fail mid-move)
            heads = await self.ledger.heads([n for n in names if n not in self.moving], isolate=True)
            todo = [n for n in names if (cur := self.nodes.get(n)) is None or not cur.stamp or n in self.moving
                    or heads.get(n) != (cur.version, cur.stamp)]
        self._bases = {}
        try:
            read = await self.ledger.reread(todo, self.digests(todo), isolate=True, apart=self.moving)
        finally:
            bases, self._bases = self._bases, None
        snaps = dict(read.snaps)
        for name in read.moving:  # not read: as last known here, offered by no filter (`moving`)
            if (cur := self.nodes.get(name)) is not None:
                snaps[name] = cur
        newer = set()  # written here onto what the read found, while it was under way
        for name, snap in read.snaps.items():
            cur = self.nodes.get(name)
            if cur is None:
                continue
            if cur == snap:
                snaps[name] = cur  # same value: keep its seq, so what was derived from it stays valid
            elif snap in bases.get(name, ()) and cur.version > snap.version:
                # the extender's own booking or release, applied from its script's reply (Mirror.apply takes
                # only the next write of the history it holds): the read is of the node before that write.
                # Installing it would hide the booking until the feed's copy comes, and a filter meanwhile
                # would offer its cards again (tests/redis/test_mirror_resync.py). Only when the write was
                # applied onto the very value read: onto another one (a snapshot here that differs from the
                # ledger under the same last write, which only this read can see; another history after a
                # flush or failover) it would carry the ledger's (version, stamp) over content the ledger
                # lacks, which no periodic resync reads again. Then the read is installed, and the feed's
                # copy of the write applies onto it.
                snaps[name] = cur
                newer.add(name)
        valid = set()
        kept = set(names) - set(todo)  # not read: their last write is the one the mirror holds
        for name in read.unchanged | kept:
            cur = self.nodes.get(name)
            if cur is not None:
                snaps[name] = cur  # as last read (or newer: a change applied here while reading)
                if name in self._digests:
                    valid.add(name)  # nothing changed it here since the text was read
        self.read += len(todo)
        self.decoded += len(read.snaps)
        listed = set(names)
        for gone in self.ledger.known_nodes() - listed:  # (removed while the feed was away, or never announced)
            self.ledger.forget(gone)
        # a node noted moving that the ledger does not list (a failed release of a pod on a node without cards) is
        # asked alone: kept while its slot is open, so that the watchers hold its work back until then
        unlisted = {n for n in self.moving - listed if await self.ledger.slot_open(n)}
        self._set_moving(((self.moving - set(todo)) | read.moving) & listed | unlisted,
                         retried=(set(todo) & self.moving) | unlisted)
        try:
            self.replace_all(snaps)
        finally:  # (also when a listener raised: every node was installed and announced all the same)
            # each digest is of the text the mirror's snapshot of that node was decoded from (or equals)
            digests = {n: d for n, d in self._digests.items() if n in valid}
            digests.update((n, d) for n, d in read.digests.items()
                           if n in read.snaps and n in self.nodes and n not in newer)
            self._digests = digests

    def note_moving(self, node: str) -> None:
        """A script on `node` failed because its Cluster slot is being moved (Ledger.on_moving): its snapshot here
        may be stale from now on, and a periodic resync would not see it (a node's version, one key, reads fine
        mid-move), so it is offered by no filter until it can be read again."""
        if node not in self.moving:
            self._set_moving(self.moving | {node})

    def _set_moving(self, nodes: Iterable[str], retried: Iterable[str] = ()) -> None:
        """These nodes are the ones that cannot be read for a slot moving between shards (said when it changes).
        `retried`: the moving nodes just read again; if some still are, the next read waits twice as long."""
        moving = frozenset(nodes)
        new = moving - self.moving
        if moving != self.moving:
            if new:
                log.warning("mirror: %d node(s) cannot be read while their Redis Cluster slot moves between shards "
                            "(offered by no filter until read again): %s", len(moving),
                            ", ".join(sorted(moving)[:5]) + (", ..." if len(moving) > 5 else ""))
            elif not moving:
                log.info("mirror: every node can be read again")
            self.moving = moving
            MIRROR_MOVING.set(len(moving))
        if not moving:
            self._moving_wait = MOVING_RETRY_SECONDS
            return
        if new:
            self._moving_wait = MOVING_RETRY_SECONDS
        elif moving & set(retried):
            self._moving_wait = min(MOVING_RETRY_MAX_SECONDS, self._moving_wait * 2)
        else:
            return  # none read again: the read already planned stands
        with contextlib.suppress(RuntimeError):  # (no loop: a test calling resync from outside one)
            self._moving_at = asyncio.get_running_loop().time() + self._moving_wait

    def learn_digest(self, node: str, digest: int, snap: NodeSnapshot) -> None:
        """Another reader in this process decoded `snap` from a reply with this digest (the reconciler): when
        that is the mirror's snapshot of the node, keep the digest for the next reader (`decoded_as`)."""
        if self.nodes.get(node) == snap:
            self._digests[node] = digest

    def digests(self, nodes: Iterable[str]) -> dict[str, int]:
        """Of these nodes, the digest of the ledger reply each one's snapshot here was decoded from (Ledger.reread),
        for another reader in this process to skip decoding what the mirror already holds (`decoded_as`)."""
        return {n: d for n in nodes if (d := self._digests.get(n)) is not None}

    def decoded_as(self, node: str, digest: int) -> NodeSnapshot | None:
        """The mirror's snapshot of `node` if it is what a reply with this digest decodes to, else None (the
        node changed here since, or was never read with that reply)."""
        return self.nodes.get(node) if self._digests.get(node) == digest else None

    def replace_all(self, snaps: Mapping[str, NodeSnapshot]) -> None:
        """Install these snapshots as every node the mirror holds (a resync; tests and tools). Only nodes whose
        snapshot is another object (or gone) are announced: an unchanged one keeps what was derived from it."""
        old = self.nodes
        self.nodes = dict(snaps)
        gone = [n for n in old if n not in self.nodes]  # listeners find it missing, as after a "removed" message
        # Every one is announced even if a listener raises on one of them (the first error is raised after):
        # a node installed here but not announced would keep this very object, so no later resync would
        # announce it either (tests/redis/test_redteam_resync.py)
        _all(self._notify, [*gone, *(n for n, snap in self.nodes.items() if old.get(n) is not snap)])

    def put(self, snap: NodeSnapshot) -> None:
        """Install one snapshot as the mirror's view of its node (tests and tools; the feed uses apply)."""
        self.nodes[snap.node] = snap
        self._notify(snap.node)

    def _notify(self, node: str) -> None:
        """Called after every change of `nodes` (written only here: the derived views depend on it)."""
        self._digests.pop(node, None)  # the last text read no longer describes the node's snapshot
        self._track(node)
        _all(lambda cb: cb(node), list(self.on_change))  # a listener raising does not keep it from the others

    async def _refetch(self, node: str) -> None:
        self.refetches += 1
        snap = await self.ledger.snapshot(node, give_up=slot_moving)  # a moving slot: redis-py retried it already
        if snap is None:
            self.nodes.pop(node, None)
        else:
            self.nodes[node] = snap
        self._notify(node)

    def apply(self, msg: Mapping[str, Any]) -> str | None:
        """Apply one feed message; returns the node name if it must be re-read instead.

        Raises KeyError/TypeError/ValueError on a malformed message, before changing anything.
        """
        node = msg["node"]
        if not isinstance(node, str) or not node:
            raise ValueError(f"feed message names no node: {node!r}")
        version = int(msg["version"])
        kind = msg.get("kind")
        cur = self.nodes.get(node)
        stamp, prev = msg.get("stamp"), msg.get("prev")
        if kind == "removed":
            # Pub/Sub channels are shared by every database of a Redis: this may be the removal of a node of the same
            # name in another database's ledger (the same keyPrefix). Dropped only when our snapshot is of the write
            # it follows (a message without `prev`, of an earlier release, is taken as it says); else read again.
            if cur is not None and cur.stamp and isinstance(prev, str) and prev != cur.stamp:
                return self._stale(node, "history")
            self.nodes.pop(node, None)
            self.ledger.forget(node)
            self._notify(node)
            return None
        if kind == "rebuild":
            return self._stale(node, "rebuild")
        if cur is None:
            # read, even a new node's first write (version 1): its message may be of another database's ledger
            return self._stale(node, "unknown")
        if version == 1 and cur.version > 1:
            # the node's keys were created anew (removed, or Redis flushed): ours are stale
            return self._stale(node, "recreated")
        if version == cur.version and cur.stamp and isinstance(stamp, str) and stamp and stamp != cur.stamp:
            # another write with our version: the keys made anew, or a failover lost ours
            return self._stale(node, "history")
        if version <= cur.version:
            return None  # already have it (e.g. read after the change was published)
        span = msg.get("span", 1)  # versions this write counts: one per reservation it changed (mark_bound)
        if not isinstance(span, int) or isinstance(span, bool) or not 1 <= span <= MARK_BOUND_MAX:
            raise ValueError(f"feed message span {span!r}: allowed 1..{MARK_BOUND_MAX}")
        if version != cur.version + span:
            return self._stale(node, "gap")
        if cur.stamp and isinstance(prev, str) and prev != cur.stamp:
            # the write before this one is not the one our snapshot is of (another history: the keys made
            # anew, or a shard that failed over to a replica lacking our write): merged into ours it would
            # carry the ledger's (version, stamp) with other content, which no periodic resync reads again
            return self._stale(node, "history")
        # shapes_only: a booking's cards and reservation are left undecoded (the node's usage here goes stale)
        usage = not (self.shapes_only and kind in BOOKINGS and not msg.get("full", True))
        # Decode everything first, so a malformed message leaves the node as it was. A full message
        # (or one without the flag) carries every card; otherwise only the cards that changed, with
        # false for a card that is gone.
        cards = (msg.get("cards") or {}) if usage else {}
        changed = {int(k): (CardRecord.from_json(int(k), v) if v else None) for k, v in
                   (cards.items() if isinstance(cards, dict) else [])}
        uid = msg.get("uid") if usage else None
        res = msg.get("res") if uid else None
        new_res = Reservation.from_json(str(uid), res) if uid and res else None
        more = msg.get("more") if uid else None  # the other reservations a batched `bound` changed
        also = {str(u): Reservation.from_json(str(u), r) for u, r in more.items()} if isinstance(more, dict) else {}
        new_cards: Mapping[int, CardRecord] = cur.cards
        if msg.get("full", True):
            new_cards = {k: v for k, v in changed.items() if v is not None}
        elif changed:
            merged = dict(cur.cards)
            for k, rec in changed.items():
                if rec is None:
                    merged.pop(k, None)
                else:
                    merged[k] = rec
            new_cards = merged
        reservations = cur.reservations
        if uid:
            reservations = dict(cur.reservations)
            if new_res is not None:
                reservations[str(uid)] = new_res
            else:
                reservations.pop(str(uid), None)
                self.ledger.forget(node, str(uid))  # (released: no script of ours need declare its key again)
            reservations.update(also)
        if self._bases is not None:  # a resync is reading: it must know what this write was applied onto
            self._bases.setdefault(node, []).append(cur)
        # the whole snapshot replaced by a new value (a new seq), never an edit in place
        self.nodes[node] = dataclasses.replace(cur, version=version, error=str(msg.get("error") or ""),
                                               cards=new_cards, reservations=reservations,
                                               stamp=str(msg.get("stamp") or ""))
        self.applied += 1
        self._notify(node)
        return None

    def _hear(self) -> None:
        """The feed connection brought something: alive, no PING outstanding."""
        self._heard, self._pinged = asyncio.get_running_loop().time(), None

    def _stale(self, node: str, why: str) -> str:
        """`node` must be re-read instead of applying the message; `why` is counted if it is re-read."""
        self._why = why
        return node

    def _on_reconnect(self, connection: Any) -> None:
        # The client reconnects (and resubscribes) by itself after a dropped connection, e.g. a Redis
        # restart: whatever was published meanwhile is lost, and versions may have started over.
        self._reconnected = True

    async def _consume(self, raw: Any, new: dict[str, str] | None = None) -> None:
        """Apply one feed message; re-read its node when it cannot be applied. `new` (node -> why): a node not
        held here is put there instead, for `_read_new` to read with the others after the messages at hand (none
        of them can change it meanwhile: a message applies only onto a node held, and a removal of one not held
        changes nothing; the read, sent after them all, sees at least their writes)."""
        stale = self._handle(raw)
        if stale and new is not None and stale not in self.nodes and stale not in self.moving:
            new.setdefault(stale, self._why)
            return
        if stale and stale in self.moving:
            # a write there went through (the move may have ended): its slot asked and the node read soon, as
            # every moving node is (resync `only`), not here, where a read may go through while bookings fail
            self._moving_at = 0.0
            return
        if stale:
            why = self._why  # before the await: a bind's own apply may set another meanwhile
            try:
                await self._refetch(stale)
            except RESEND as e:  # as Ledger._retry raised it, once its tries ran out
                if not slot_moving(e):
                    raise
                # its snapshot stays, offered by none until read (Ledger.on_moving has told note_moving already)
                self.note_moving(stale)
                return
            # (a node noted moving meanwhile stays so: only its slot, asked by a resync, ends that)
            MIRROR_REREADS.labels(why).inc()  # made (a read lost with Redis is not counted)

    async def _read_new(self, new: Mapping[str, str]) -> None:
        """The nodes the feed named that the mirror does not hold (`_consume`), read together: pipelined,
        SNAPSHOT_BATCH per round trip, as a resync reads. Every message of a node is read (it may be another
        database's ledger's: Pub/Sub is shared by all of a Redis's databases), so a fleet added at once (a new
        cluster's 5,000 nodes) cost one round trip per node (two: the node's keys unknown, MOREKEYS), one after the
        other, and the feed (every other node's bookings) waited behind them
        (tests/redis/test_redteam_day2_new_nodes.py)."""
        names = [n for n in new if n not in self.nodes]  # (none can be held meanwhile: nothing applies onto it)
        self.refetches += len(names)
        read = await self.ledger.reread(names, {}, isolate=True)
        got = [n for n in names if n not in read.moving]
        for node in got:
            snap = read.snaps.get(node)
            if snap is None:
                self.nodes.pop(node, None)
            else:
                self.nodes[node] = snap
            MIRROR_REREADS.labels(new[node]).inc()
        for node in read.moving:  # offered by none until read (as _consume): its slot asked soon
            self.note_moving(node)
        _all(self._notify, got)  # every one announced, even if a listener raises on one (as replace_all)

    def _handle(self, raw: Any) -> str | None:
        """Decode and apply one feed message; returns a node to re-read, if any."""
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            log.warning("ignoring undecodable feed message")
            return None
        if isinstance(data, dict) and data.get("kind") in NOTICES:  # a request, not a change: nothing to apply
            node = data.get("node")
            if isinstance(node, str) and node in self.nodes:  # only known nodes: a notice acts on no other node
                name: str = node
                _all(lambda cb: cb(name), list(self.on_notice[str(data["kind"])]))
            return None
        try:
            return self.apply(data)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            node = data.get("node") if isinstance(data, dict) else None
            log.warning("malformed feed message (%s: %s)%s", type(e).__name__, e,
                        f"; re-reading node {node}" if isinstance(node, str) and node else "; ignored")
            return self._stale(node, "malformed") if isinstance(node, str) and node else None

    async def _run(self) -> None:
        backoff = Backoff(0.2, 5.0)
        while True:
            pubsub = self.subscriber.pubsub()
            conn = None
            try:
                await pubsub.subscribe(self.ledger.feed)
                conn = pubsub.connection
                if conn is not None:
                    conn.register_connect_callback(self._on_reconnect)
                self._reconnected = False
                await self.resync(full=True)  # after subscribing, so no change falls between the two
                MIRROR_FULL_READS.labels("lost" if self._subscribed_once else "start").inc()
                self.ready.set()
                if self._subscribed_once:  # back after losing Redis: what was published meanwhile is lost
                    for cb in self.on_reconnect:
                        cb()
                else:
                    for cb in self.on_first_sync:
                        cb()
                self._subscribed_once = True
                loop = asyncio.get_running_loop()
                next_resync = loop.time() + self.resync_seconds
                up_since: float | None = loop.time()  # None once it has worked FEED_WORKS_SECONDS
                self._hear()
                while True:
                    # every reply counts as a sign of life, so none is ignored here (a RESP3 pong, "PONG" as
                    # text, is no "pong" message to redis-py): only channel messages are applied below
                    msg = await pubsub.get_message(timeout=min(1.0, self.silence_seconds))
                    if msg is None and self._pinged is not None and loop.time() - self._pinged >= self.silence_seconds:
                        # a reply may have come in the same loop turn the wait ended (a loop held up meanwhile)
                        msg = await pubsub.get_message(timeout=0.0)
                        if msg is None:
                            self.silences += 1
                            FEED_SILENCES.inc()
                            raise FeedSilent(f"the feed connection answered no PING in {self.silence_seconds:g}s")
                    if msg is not None:
                        self._hear()
                    elif self._pinged is None and loop.time() - self._heard >= self.silence_seconds:
                        if await master_replaced(self.subscriber, conn):  # (silent there: it takes no write)
                            await master_replaced(self.ledger.redis)  # its reads leave that master too
                            raise FeedDeposed("the feed's master was replaced by the sentinels")
                        await pubsub.ping()  # only sent: its reply comes back like a message
                        self.pings += 1
                        self._pinged = loop.time()
                    if up_since is not None and loop.time() - up_since >= FEED_WORKS_SECONDS:
                        backoff.reset()
                        up_since = None
                    if self._reconnected:
                        self._reconnected = False
                        log.warning("mirror's feed connection was re-established: re-reading everything%s",
                                    f" in {backoff.delay:.1f}s" if up_since is not None else "")
                        if up_since is not None:  # lost again soon after the last time: paced as a loss
                            self.ready.clear()  # (what was published meanwhile is lost: not in sync until read)
                            await backoff.sleep()
                        await self.resync(full=True)
                        MIRROR_FULL_READS.labels("reconnected").inc()
                        self.ready.set()
                        up_since = loop.time()
                        for cb in self.on_reconnect:
                            cb()
                        self._hear()  # a PING sent on the connection that was replaced is not waited for
                        next_resync = loop.time() + self.resync_seconds
                    if msg is not None and msg.get("type") == "message":
                        new: dict[str, str] = {}  # nodes not held here that these messages name: read together
                        await self._consume(msg["data"], new)
                        # the messages that came with it, already read from the socket: taken here, in order
                        async for data in buffered_messages(pubsub, self._hear):
                            self.buffered += 1
                            await self._consume(data, new)
                        if new:
                            await self._read_new(new)
                    if loop.time() >= next_resync:
                        await self.resync()
                        next_resync = loop.time() + self.resync_seconds
                    elif self.moving and loop.time() >= self._moving_at:
                        await self.resync(only=self.moving)
            except asyncio.CancelledError:
                raise
            except LOST as e:
                self.ready.clear()
                log.warning("mirror lost Redis (%s); retrying in %.1fs", explain(e) if credentials_refused(e) else e,
                            backoff.delay)
                await backoff.sleep()
            finally:
                if conn is not None:
                    conn.deregister_connect_callback(self._on_reconnect)
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
