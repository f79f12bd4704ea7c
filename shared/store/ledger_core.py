"""The Ledger's plumbing: its scripts (loaded once, called by SHA), one script on one node's keys (`_call`, which
declares the keys the node is known to have and learns more on MOREKEYS), and the resend rule every round trip
follows (`_retry`). The reads (shared/store/ledger_reads.py), the server's checks (server_checks.py) and the
bookings (ledger.py) build on it."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from functools import partial
from typing import Any, TypeVar, cast

import orjson
from redis import exceptions as rexc
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript

from shared.domain.state import NodeSnapshot
from shared.serving.metrics import REDIS_DAMAGED_KEYS, REDIS_RESENDS, REDIS_ROUND_TRIPS
from shared.serving.supervise import TransientError
from shared.store.keys import CLEAR, DAMAGED, MOREKEYS, NOTHING, Known, Layout
from shared.store.redis_conn import Explained, acl_refused, explain
from shared.store.resend import RESEND_OR_REDIRECT, resendable, slot_moving
from shared.store.scripts import SCRIPTS, script_source

log = logging.getLogger("mtsched.ledger")
# A Redis outage makes every call in flight resend about ten times in its retry_seconds: a line each was hundreds
# of lines a second on a busy extender. One line per operation this often (with how many it stands for); the
# counter mtsched_redis_resends_total has them all.
RESEND_LOG_EVERY_S = 1.0
T = TypeVar("T")
Payload = Mapping[str, Any] | Callable[[], Mapping[str, Any]]  # a script's payload, or what makes it (_call)
# Calls of one script while it answers MOREKEYS. One more is needed whenever the node gained a reservation
# (or a card) since the keys were last seen; a node changing that fast is rare, but the stress test's three
# replicas booking one node without pause made a snapshot ask up to 12 times.
KEY_ROUNDS = 32


class LedgerError(RuntimeError):
    """A script refused its input (BADINPUT) or Redis failed; state is unchanged."""


class AclRefusedError(LedgerError, TransientError, Explained):
    """Redis refused the ACL user a command, key or channel the roles use. Granting it cures that with no restart
    (docs/install.md "Redis"), so a role keeps trying, unready and saying what to grant, as for a wrong password;
    it does not give up and crash-loop."""


def failed(what: str, e: BaseException) -> LedgerError:
    """The LedgerError for `e` met doing `what`: an ACL refusal in words that say what to grant (explain)."""
    return AclRefusedError(f"{what}: {explain(e)}") if acl_refused(e) else LedgerError(f"{what}: {e}")


class LedgerCore:
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

    async def ping(self, give_up: Callable[[BaseException], bool] | None = None) -> None:
        """One PING, sent again as every round trip is (_retry); one `give_up` accepts is raised at once (a one-shot
        command's credentials refused: redis_conn.credentials_refused)."""
        await self._retry("ping", lambda: cast("Awaitable[bool]", self.redis.ping()), give_up)

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
                     resent: list[BaseException] | None = None, *, about: str | None = None) -> T:
        """One round trip, sent again on a RESEND error (`connection_retries` times, and until `retry_seconds`);
        one that `give_up` accepts is raised at once (a reader that can do without the node: slot_moving).

        A pooled connection that died with a Redis restart fails once and then reconnects. Sending
        again is safe: every script is idempotent by pod uid (a reserve whose reply was lost answers
        the second time with the cards it booked), and so are SADD/SREM/SMEMBERS/EXISTS/SET.
        `resent` (a caller's list) is told each error a send was repeated after: one that may have run, its reply
        lost (a timeout, a connection cut), is answered again as by a second run (a release: nothing held).
        A refusal of the ACL user (NOPERM, a script's command, key or channel refused) is raised as an
        AclRefusedError that says what to grant, naming `about` (default `what`, the metrics' label).
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
            except rexc.ResponseError as e:
                # an ACL refusal, of a plain command or a script's, said once here with what to grant (a
                # TransientError: granting the rule cures it with no restart); any other reply error as it is
                if acl_refused(e):
                    raise failed(about or what, e) from e
                raise

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

    async def _call(self, name: str, node: str, payload: Payload | None = None,
                    keys: Callable[[Known], list[str]] | None = None,
                    give_up: Callable[[BaseException], bool] | None = None,
                    resent: list[BaseException] | None = None) -> Any:
        """Run one script on one node. `keys` makes its KEYS from what is known of the node (default:
        every key of the node); after MOREKEYS it is called again with what the script asked for. `payload` may be
        a function that makes it, called for every send (a payload whose durations count from the call, not from
        each send: Ledger.replace_node's keep window, sent again seconds later after a reply was lost)."""
        script = self._scripts[name]
        clear = False  # met WRONGTYPE: the next call deletes the node's keys of another type (_lib.lua: clear_damage)

        def send(declared: list[str]) -> Awaitable[Any]:
            body = payload() if callable(payload) else payload
            args = (self.feed, node, orjson.dumps(body or {}).decode())
            return self._script(script, declared, (*args, CLEAR) if clear else args)

        make = keys or (lambda known: self.keys.whole_node(node, known))
        for _ in range(KEY_ROUNDS):
            declared = make(self.known(node))
            try:
                return await self._retry(name, partial(send, declared), give_up, resent, about=f"{name} on {node}")
            except Exception as e:
                if slot_moving(e):  # raised as it is (TRYAGAIN is a ResponseError too): Redis unavailable there
                    self._moving(node)
                    raise
                if not isinstance(e, rexc.ResponseError):
                    raise
                if wrong_type(e):  # a key of another type: cleared by the next call, which the script refused
                    clear = True
                    continue
                if str(e).startswith(DAMAGED):  # the keys are gone now: the same call reads them as missing
                    said_damaged(name, node, str(e))
                    clear = False
                    continue
                if not str(e).startswith(MOREKEYS):  # (an ACL refusal was said by _retry, naming the node)
                    raise LedgerError(f"{name} on {node}: {e}") from e
                self._known[node] = self.known(node).learn(str(e))
                log.debug("%s on %s: the node has keys this ledger did not know of; calling again", name, node)
        raise LedgerError(f"{name} on {node}: the node's cards and reservations kept changing; try again")

    async def _script(self, script: AsyncScript, keys: list[str], args: tuple[str, ...]) -> Any:
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


def wrong_type(e: BaseException) -> bool:
    """A script's WRONGTYPE (Redis 6.2 wraps it in the script's error): a declared key of another type."""
    return isinstance(e, rexc.ResponseError) and "WRONGTYPE " in str(e)


def said_damaged(what: str, node: str, reply: str) -> None:
    """A script's DAMAGED answer (_lib.lua: clear_damage), logged: keys of another type than the layout's were
    deleted (an edit behind the scripts' back); the watchers write what they held again."""
    REDIS_DAMAGED_KEYS.inc(len(orjson.loads(reply[len(DAMAGED):]) or []))
    log.error("%s on %s: deleted keys of another type than docs/redis-layout.md gives them (not written by mtsched: "
              "an edit behind its back?): %s; the watchers repair the node", what, node, reply[len(DAMAGED):])


def now_ms() -> int:
    return int(time.time() * 1000)
