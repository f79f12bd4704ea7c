"""Redis clients from a URL, for every role: standalone (redis://, rediss://, unix://), Sentinel
(redis+sentinel://) and Cluster (redis+cluster://), with the password and TLS options of the
configuration, and the feed subscriber's client (`connect_subscriber`). Errors are explained in
words that name the setting to change (`explain`), never the password.
"""

from __future__ import annotations

import asyncio
import sys
import types
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from redis import exceptions as rexc
from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, ClusterPipeline, RedisCluster
from redis.asyncio.connection import Connection as RedisConnection
from redis.asyncio.connection import ConnectionPool
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPool, SentinelManagedConnection

from shared.config import Config, redis_password
from shared.serving.supervise import redis_refusal
from shared.serving.waits import within


class _AsyncioKeepingCancels(types.ModuleType):
    """asyncio as redis-py's connection module sees it, but for wait_for (`_keep_cancels`)."""

    def __getattr__(self, name: str) -> object:
        return getattr(asyncio, name)


def _keep_cancels() -> None:
    """redis-py (7.4.1) sends every command under asyncio.wait_for when the client has a socket timeout, as every
    client made here has: on Python 3.11 a task cancelled as its command's send completes went on as if never
    cancelled (23-32 of 60 cancels lost, bench/cancel_probe.py). Its connection module is given an asyncio whose
    wait_for is `within` (shared/serving/waits.py), which keeps them and spends no task per command."""
    import redis.asyncio.connection as connection_module

    if sys.version_info >= (3, 12) or isinstance(getattr(connection_module, "asyncio", None), _AsyncioKeepingCancels):
        return
    async def wait_for(fut: Awaitable[Any], timeout: float | None) -> Any:  # asyncio.wait_for's parameters
        return await within(fut, timeout)

    shim = _AsyncioKeepingCancels("asyncio")
    shim.wait_for = wait_for  # type: ignore[attr-defined]
    setattr(connection_module, "asyncio", shim)  # noqa: B010 (a module's global that mypy's stubs do not export)


_keep_cancels()


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

# How long a Redis server may leave a command unanswered, or a connection unopened, before the client gives up on
# that connection (TimeoutError: the ledger sends again, on a new connection, to whatever the address, the sentinels
# or the cluster name now). Without it, a server that hangs rather than dies (a paused VM, a partition that drops
# packets: no reset ever comes) kept every pooled connection to it waiting, for as long as TCP takes to give up
# (~15 min; forever on a frozen process of this machine): on Sentinel the watchers' pass stuck in one such call
# verified no node again after the failover, and the stack bound nothing (tests/redis_ha/test_hung_master.py); a
# standalone Redis behind a Service address that moved to a new pod (its node cut off) did the same
# (tests/redis/test_address_moves.py). Longer than any one reply takes (a pipelined read of thousands of nodes is
# answered in well under a second). A standalone URL's own `?socket_timeout=` wins.
SOCKET_TIMEOUT = 5.0
# How Redis 6.2 and 7.0 refuse a command, key or channel a script sends to the ACL user running it (a plain error
# reply, not NOPERM, naming no command: Redis's ACL LOG does, with context "lua"; tests/redis/test_acl_user.py)
SCRIPT_DENIED = "The user executing the script can't"
# ... and Redis 7.2 and later ("ERR ACL failure in script: No permissions to access a key script: ..."; a key or
# channel refused is "No permissions to", a command "has no permissions to": tests/unit/test_acl_refusal_wording.py)
SCRIPT_ACL_FAILURE = "ACL failure in script"


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
    Cluster: a RedisCluster (every ledger script gets all its keys in KEYS, all under one node's hash
    tag, so it is routed by that slot; redis-py's script objects work with it as they are). For the
    feed's Pub/Sub connection use `connect_subscriber`.
    """
    if options.tls and not url.startswith("rediss://"):
        raise ValueError("a CA or client certificate for Redis needs a rediss:// URL")
    if url.startswith("redis+sentinel://"):
        return _connect_sentinel(url, options.password)
    if url.startswith("redis+cluster://"):
        hosts, username, password, _path, _query = _split_ha_url(url, 6379)
        return _Cluster(startup_nodes=[ClusterNode(h, p) for h, p in hosts],  # type: ignore[return-value]
                        username=username, password=password or options.password, decode_responses=True,
                        socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=SOCKET_TIMEOUT)
    # redis-py lets the URL's own password (and ssl_* query options) win over these arguments
    extra: dict[str, Any] = {"password": options.password} if options.password else {}
    extra.update(options.tls)
    return Redis.from_url(url, decode_responses=True, socket_timeout=SOCKET_TIMEOUT,
                          socket_connect_timeout=SOCKET_TIMEOUT, **extra)


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


class Explained(Exception):
    """An error whose text already says what to configure: `explain` gives it as it is (ledger_core's
    AclRefusedError, raised where a round trip was refused, meets `explain` again in a CLI or a role's readiness)."""


def _refusal(error: BaseException) -> tuple[str, str]:
    """(kind, text) of a Redis failure: kind "wrong" (the password refused), "none" (a password needed and none
    given), "unneeded" (a password given to a Redis that has none), "sentinels" (the sentinels refused the
    credentials), "denied" (the ACL user may not run a command or touch a key or channel the roles use), "tls"
    (the server's certificate not trusted), or "" for anything else."""
    cause: BaseException | None = error
    while cause is not None and not isinstance(cause, rexc.AuthenticationError):
        cause = cause.__cause__  # RedisCluster wraps the node's refusal in a RedisClusterException
    text = str(cause or error)
    if cause is not None and ("invalid username-password pair" in text or "WRONGPASS" in text):
        return "wrong", text
    if cause is not None and ("without any password configured" in text or "no password is set" in text):
        return "unneeded", text  # a password given to a Redis that has none
    # a large command (a script) of a client that has not authenticated is refused by Redis with a protocol
    # error rather than NOAUTH (Ledger.load_scripts PINGs first to get the NOAUTH)
    if cause is not None or (isinstance(error, rexc.ResponseError) and "unauthenticated" in text):
        return "none", text
    if (isinstance(error, rexc.NoPermissionError) or "NOPERM" in text or "no permissions to" in text.lower()
            or SCRIPT_DENIED in text or SCRIPT_ACL_FAILURE in text):
        return "denied", text  # an ACL user without a command, key or channel the roles use (a script's too)
    if "CERTIFICATE_VERIFY_FAILED" in text:
        return "tls", text
    if "AuthenticationError" in text:  # Sentinel's MasterNotFoundError names the sentinels' own errors only
        return "sentinels", text
    return "", text


def acl_refused(error: BaseException) -> bool:
    """Whether `error` is Redis refusing a command, key or channel to this client's ACL user (NOPERM, or a script's
    command refused so), which only a change of the user's ACL cures (docs/install.md "Redis")."""
    return _refusal(error)[0] == "denied"


def credentials_refused(error: BaseException) -> bool:
    """Whether `error` is Redis (or its sentinels) refusing this client's credentials, missing or wrong: sending
    again cannot cure it (a one-shot command stops at once; the roles keep trying, as a fixed Secret and a
    restart, or a server given the password, cure it)."""
    return _refusal(error)[0] in ("wrong", "none", "unneeded", "sentinels", "denied")


def explain(error: BaseException) -> str:
    """A Redis connection failure in words that say what to configure (never the password)."""
    if isinstance(error, Explained):
        return str(error)
    kind, text = _refusal(error)
    if kind == "wrong":
        return (f"Redis refused the password (wrong password or user: check the one redisPasswordFile, "
                f"MTSCHED_REDIS_PASSWORD or the URL's redis://[USER]:PASSWORD@host gives; each role reads it at its "
                f"start, so restart the roles after changing it): {text}")
    if kind == "none":
        return (f"Redis requires a password and none was given (set redisPasswordFile, or "
                f"MTSCHED_REDIS_PASSWORD, or give it in the URL: redis://:PASSWORD@host:port/db): {text}")
    if kind == "unneeded":
        return (f"a password was given but this Redis has none (remove it from redisPasswordFile, "
                f"MTSCHED_REDIS_PASSWORD or the URL, or set Redis's requirepass): {text}")
    if kind == "denied":
        # (what Redis said first: a role's readiness keeps the first 300 characters of a failure)
        return (f"the Redis user may not do what the roles need ({text}; Redis's ACL LOG names what it refused): "
                f"grant it the commands, keys and channel docs/install.md lists under 'Redis', or use another user "
                f"in the URL's redis://USER:PASSWORD@host")
    if kind == "tls":
        return f"Redis's TLS certificate is not trusted (set redisCAFile to the CA that signed it): {text}"
    if kind == "sentinels":
        return (f"the sentinels refused the credentials (no password or a wrong one: redisPasswordFile, "
                f"MTSCHED_REDIS_PASSWORD, the URL's redis+sentinel://:PASSWORD@host, or ?sentinel_password= "
                f"when they have their own): {text}")
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


_LATE: set[asyncio.Task[Any]] = set()  # sentinels' answers no longer waited for (each ends by its socket timeout)


def _late(task: asyncio.Task[Any]) -> None:
    _LATE.discard(task)
    if not task.cancelled():
        task.exception()  # retrieved: no "exception was never retrieved" for a sentinel that did not answer


class _Sentinel(Sentinel):
    """redis-py's Sentinel, whose master is the one named with the newest config epoch by the first majority of the
    sentinels to answer, not by the first sentinel (the one that answered last time, else the URL's first).

    A sentinel cut off with the master it names (beside it: the same zone, or the same pod where a chart puts a
    sentinel next to each data node) never hears of the failover the others made, and goes on naming the old master,
    which it still reaches and sees as a master, with the epoch from before the failover. Taken first, it sent every
    connection, and every write a replaced master refused (_SentinelMasterConnection), back to the old master for the
    whole partition (tests/redis_ha/test_rev_deposed_ran_nothing.py). A failover is voted by a majority of the
    sentinels, so any majority holds one that took part; the others' answers are not waited for (a sentinel down or
    cut off costs no lookup its socket timeout)."""

    async def discover_master(self, service_name: str) -> tuple[str, int]:
        asks = {asyncio.ensure_future(s.sentinel_masters()): place  # type: ignore[no-untyped-call]
                for place, s in enumerate(self.sentinels)}
        majority = len(asks) // 2 + 1
        best: tuple[tuple[int, int], dict[str, Any]] | None = None  # ((config epoch, -place), state)
        answered = 0
        unreachable: list[str] = []
        refusal: BaseException | None = None  # a sentinel's error reply (an ACL refusal): raised if none names one
        pending = set(asks)
        try:
            while pending and answered < majority:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for ask in done:
                    place = asks[ask]
                    error = None if ask.cancelled() else ask.exception()
                    if ask.cancelled() or isinstance(error, (rexc.ConnectionError, rexc.TimeoutError)):
                        unreachable.append(f"{self.sentinels[place]} - {error!r}")
                        continue
                    if error is not None:
                        refusal = refusal or error
                        continue
                    answered += 1
                    state = ask.result().get(service_name)
                    if state and self.check_master_state(state, service_name):
                        key = (int(state.get("config-epoch") or 0), -place)
                        if best is None or key > best[0]:
                            best = key, state
        except BaseException:  # cancelled: so are the asks
            for ask in pending:
                ask.cancel()
            raise
        for ask in pending:
            _LATE.add(ask)
            ask.add_done_callback(_late)
        if best is None:
            if refusal is not None:
                raise refusal
            raise MasterNotFoundError(f"No master found for {service_name!r}"
                                      + (f" : {', '.join(unreachable)}" if unreachable else ""))
        state = best[1]
        return self._force_master_ip if self._force_master_ip is not None else state["ip"], state["port"]


def _connect_sentinel(url: str, default_password: str | None) -> Redis:
    from redis.asyncio.retry import Retry
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
    sentinel = _Sentinel(hosts, sentinel_kwargs=sentinel_kwargs, username=username, password=password,
                        decode_responses=True, socket_timeout=SOCKET_TIMEOUT,
                        socket_connect_timeout=SOCKET_TIMEOUT)  # type: ignore[no-untyped-call]
    return sentinel.master_for(parts[0], redis_class=_SentinelMaster,  # type: ignore[no-any-return]
                               db=int(parts[1]) if len(parts) > 1 else 0, connection_class=_SentinelMasterConnection)


def is_sentinel(client: object) -> bool:
    """Whether `client` reaches its master through Sentinel (connect's redis+sentinel:// form)."""
    return isinstance(client, _SentinelMaster)


async def master_replaced(client: Redis, connection: Any = None) -> bool:
    """Whether the sentinels name another master than the one `connection` of `client` reached (default: the one
    the client's pool last asked them for), asking them now; the pool's idle connections are then dropped (redis-py
    does so when the master it knew changed), so the next ones reach the master they name. False for a client that
    is not Sentinel's, or when no sentinel answers (nothing says the master changed)."""
    pool = client.connection_pool
    if not isinstance(pool, SentinelConnectionPool):
        return False
    known = (connection.host, connection.port) if connection is not None else pool.master_address
    try:
        named = tuple(await pool.get_master_address())  # type: ignore[no-untyped-call]
    except rexc.ConnectionError:
        return False
    return known is not None and tuple(known) != named


class _SentinelMaster(Redis):
    """The master's client from Sentinel.master_for; closing it also closes the sentinel connections."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        manager = getattr(self.connection_pool, "sentinel_manager", None)
        if manager is not None:
            # each sentinel's client, closed here: redis-py 7's Sentinel has no aclose of its own
            results = await asyncio.gather(*(s.aclose() for s in manager.sentinels), return_exceptions=True)
            errors = [r for r in results if isinstance(r, BaseException)]
            if errors:
                raise errors[0]


class MasterReplaced(rexc.ConnectionError):
    """A write refused NOREPLICAS by a master the sentinels no longer name (_SentinelMasterConnection): sent again
    like a lost connection, but Redis ran nothing of it (refused at its first write), so no reply was lost
    (ledger._may_have_run)."""


class _SentinelMasterConnection(SentinelManagedConnection):
    """A connection to the master the sentinels named when it was opened, which leaves a master they have replaced
    since as redis-py leaves one they demoted (READONLY: a ConnectionError, the connection dropped, sent again).

    A master cut off from the sentinels and its replicas (a partial partition, its zone cut from the others) is
    replaced by a promoted replica, and the sentinels cannot demote it: it stays a master, and with the
    min-replicas-to-write docs/install.md asks for refuses every write, NOREPLICAS, for as long as the partition
    lasts. redis-py asks the sentinels only when it opens a connection, so a role that reached it on pooled
    connections had every booking, confirmation, record, release and readiness probe refused there all that time
    (tests/redis_ha/test_redteam_sentinel_deposed.py). A NOREPLICAS reply (a command or a script refused at its
    first write: nothing ran) from a master the sentinels no longer name drops this connection and the pool's idle
    ones and is raised as a ConnectionError (MasterReplaced: one that ran nothing), which the Ledger sends again, to
    the master they name; from the master they name (its replicas are down) it is the refusal, as it is. A connection
    that reached another master than the one its pool last learned of connects again before its next command (those in
    use when the pool dropped its idle ones: tests/redis_ha/test_rev_deposed_ran_nothing.py)."""

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        # reached before the pool learned of another master (in use when it dropped its idle connections): a command
        # sent on it would still go to the master the sentinels replaced, and a read is refused by nothing there
        known = self.connection_pool.master_address
        if self.is_connected and known is not None and (self.host, self.port) != tuple(known):
            await self.disconnect()
            await self.connect()  # type: ignore[no-untyped-call]  # (redis-py's lazy connect: the old address)
        await super().send_packed_command(command, check_health)

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().read_response(*args, **kwargs)
        except rexc.ResponseError as refused:
            if not redis_refusal(refused)[0].startswith("NOREPLICAS"):  # (6.2: inside a script's error)
                raise
            reached = (self.host, self.port)
            try:
                named = tuple(await self.connection_pool.get_master_address())
            except rexc.ConnectionError:  # no sentinel answers: nothing tells the master changed
                raise refused from None
            if named == reached:
                raise
            await self.disconnect()
            await self.connection_pool.disconnect(inuse_connections=False)
            raise MasterReplaced(f"the master at {reached[0]}:{reached[1]} refuses writes (NOREPLICAS) and the "
                                       f"sentinels name another, {named[0]}:{named[1]}") from refused


class _Cluster(RedisCluster):
    """RedisCluster whose pipelines run EVALSHA (Ledger.snapshots reads many nodes in one go), which sends an ASK
    redirect's ASKING on the command's own connection (_AskingNode), and which leaves a command whose reply may be lost
    to its caller to send again.

    redis-py 7.4.1 sent a command again by itself, up to 3 times, after a TimeoutError or a ConnectionError
    (ERRORS_ALLOW_RETRY), unknown to the Ledger: a script whose first send ran, its reply lost, was answered by its
    second run (a give-back "gone", a replace_node that dropped nothing), and sent with the keep window of its first
    send; the Ledger's resend rule (LedgerCore._retry, `resent`) answers such a call as the first run would have, and
    counts a keep window from the call, as on standalone and Sentinel, whose clients retry nothing of their own
    (tests/redis_ha/test_redteam_cluster_resend.py). Still sent again here: what Redis refused without running it (a
    shard down, a slot not covered), after redis-py reads the slots again. Pipelines (reads) keep redis-py's rule."""

    ERRORS_ALLOW_RETRY = (rexc.ClusterDownError, rexc.SlotNotCoveredError)  # type: ignore[assignment]  # (fewer)

    def pipeline(self, transaction: Any | None = None, shard_hint: Any | None = None) -> ClusterPipeline:
        if shard_hint:
            raise ValueError("shard_hint is not supported in cluster mode")
        return _ClusterPipeline(self, transaction)  # type: ignore[abstract]  # as RedisCluster.pipeline does

    def get_node(self, host: str | None = None, port: int | None = None,
                 node_name: str | None = None) -> ClusterNode | None:
        """The node; asked by name alone, as an _AskingNode (the node itself for everything but an ASKING). redis-py
        7.4.1 asks so in three places: its command loop, for the node an ASK redirect names, just before it sends
        ASKING there; set_default_node, which only asks whether the node exists; and scan_iter, which sends the
        next SCAN of each node that has more to it (`target_nodes`: a ClusterNode, or redis-py refuses it)."""
        node = super().get_node(host, port, node_name)
        if node is None or host is not None or port is not None:
            return node
        return _AskingNode(node)


class _AskingNode(ClusterNode):
    """A cluster node as redis-py's command loop follows an ASK redirect to it: the ASKING it sends first is held
    and sent with the command, in one write on one connection, as Redis needs (it lets only the connection's next
    command into a slot the node is importing) and as redis-py's sync client does.

    redis-py 7.4.1's asyncio RedisCluster._execute_command sends the two by two calls of the node's execute_command,
    each on a pooled connection of its own: the oldest idle one, given back last (ClusterNode.acquire_connection's
    popleft, then append). With an even number of connections idle there (two once another call to that node was
    in flight when ASKING was sent), ASKING went on one and the command on another, every time: the target, only
    importing the slot, answered MOVED back to the source, which answered ASK again, until redis-py's 16 redirects
    ran out (ClusterError "TTL exhausted."), at every resend too, for as long as the slot stayed open; a key a live
    reshard had moved ahead of its slot could not be read or written (tests/redis_ha/test_reshard_ask.py).

    It is the node for everything else: a ClusterNode (redis-py takes only those as `target_nodes`, which scan_iter
    passes it as) that shares the node's pool (its connection lists, the same objects) and equals it. A new one per
    lookup, so calls that follow an ASK at once each hold their own ASKING. Its connection goes back to the pool
    however the call ends, a cancellation included, as redis-py's own calls' do
    (tests/redis_ha/test_redteam_asking_node.py)."""

    __slots__ = ("_asking",)

    def __init__(self, node: ClusterNode):  # (ClusterNode.__init__ would make a pool of its own)
        for name in ClusterNode.__slots__:
            if hasattr(node, name):  # (a slot the node never set stays unset)
                setattr(self, name, getattr(node, name))
        self._asking = False

    def __del__(self, *_: Any) -> None:
        """Nothing: its connections are the node's, which warns of those left open (ClusterNode.__del__)."""

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        if args == ("ASKING",) and not kwargs:
            self._asking = True  # sent with the next command
            return True
        if not self._asking:
            return await super().execute_command(*args, **kwargs)
        self._asking = False
        connection = self.acquire_connection()
        try:
            await self.disconnect_if_needed(connection)
            await connection.send_packed_command(connection.pack_commands([("ASKING",), args]), False)
            try:
                await self.parse_response(connection, "ASKING")
            except rexc.ResponseError as refused:  # (a lost connection or a timeout is raised as it is)
                try:
                    return await self.parse_response(connection, args[0], **kwargs)  # it ran: its answer
                except rexc.ResponseError:
                    # ASKING refused (an ACL user without +asking: NOPERM), the command MOVED then: the refusal
                    raise refused from None
            return await self.parse_response(connection, args[0], **kwargs)
        finally:
            # as ClusterNode.execute_command gives its connection back; one a failure or a cancellation cut in the
            # middle was closed by redis-py (send_packed_command, read_response), and connects again at its next use
            try:
                await self.disconnect_if_needed(connection)
            finally:
                self._free.append(connection)


class _ClusterPipeline(ClusterPipeline):
    """redis-py blocks EVALSHA in cluster pipelines, as a script's keys could span slots. Ours declare
    every key they touch in KEYS, all of one node's hash tag, so EVALSHA is routed by that slot like
    any keyed command (NOSCRIPT and MOREKEYS come back as errors in their place, for Ledger.snapshots).
    A script object cannot be used here: redis-py's cluster pipeline does not take it."""

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
