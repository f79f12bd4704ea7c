"""The least-privilege Redis ACL of docs/install.md "Redis", proven on a real redis-server: a user given exactly
`ACL_RULES` runs what every role does with Redis (the extender, the webhook, the watchers' node and pod watchers,
reconciler, janitor and upkeep stamp, the mirror every role keeps, the readiness probe, `mtsched cards`), and a
user given every rule but one has at least one of those operations refused (NOPERM, or a script's command refused),
and Redis's ACL LOG names what that rule grants: no rule is there for nothing. Commands a Lua script sends are
checked against the user's ACL as well (INFO, TIME, PUBLISH, HSET ...).

The node agent does not touch Redis. `mtsched explain` reads Redis as `mtsched cards` does (PING, the node list,
the snapshot script, the upkeep stamp). redis-py's CLIENT SETINFO on each new connection is refused by Redis 6.2
and 7.2+ and the refusal ignored (test_redis_6_2); a URL naming a database other than 0 needs `+select`
(test_a_database_other_than_0_needs_select). The HA URL forms: tests/redis_ha/test_acl_user_ha.py."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from controller import cli
from controller.janitor import Janitor
from controller.upkeep import Upkeep
from deploy.local.redis import RedisServer, new_password
from deploy.local.redis62 import redis62_binary
from shared.config import Config, load_config
from shared.domain.annotations import PodUsage
from shared.serving.supervise import Supervisor
from shared.store.ledger import Ledger, RedisOptions, connect, connect_subscriber
from shared.store.mirror import Mirror
from shared.store.redis_conn import acl_refused
from shared.store.session import open_ledger
from tests.redis.helpers import S4000, S5000, inventory

pytestmark = pytest.mark.redis

DOCS = Path(__file__).resolve().parents[2] / "docs"
USER = "mtsched"
PASSWORD = "acl-user-password"


def acl_rules(prefix: str = "mt") -> tuple[str, ...]:
    """The rules docs/install.md gives, for keyPrefix `prefix`: its keys, its feed channel, and the commands the
    roles send (with those their scripts send). A keyPrefix is 1-32 of [A-Za-z0-9_.-], none of which is special
    in an ACL pattern, so it goes into the rules as it is."""
    return (f"~{prefix}:*", f"&{prefix}:feed",
            "+ping", "+info", "+time",
            "+script|load", "+evalsha", "+eval",
            "+publish", "+subscribe",
            "+get", "+set", "+exists", "+del",
            "+sadd", "+srem", "+smembers", "+sismember",
            "+hget", "+hmget", "+hset", "+hdel", "+hgetall", "+hincrby")


ACL_RULES = acl_rules()

# Each rule removed, and the first of the roles' operations (STEPS, in their order) that Redis then refuses: every
# rule of ACL_RULES is here, so each is needed
FIRST_REFUSED = {
    "~mt:*": "watcher: a new node",
    "&mt:feed": "watcher: a new node",
    "+ping": "load the scripts",
    "+info": "watcher: a new node",
    "+time": "watcher: a new node",
    "+script|load": "load the scripts",
    "+evalsha": "watcher: a new node",
    "+eval": "readiness probe",
    "+publish": "watcher: a new node",
    "+subscribe": "mirror: subscribe and read",
    "+get": "extender: upkeep stamp read",
    "+set": "watcher: rebuild and reconcile",
    "+exists": "watcher: a new node",
    "+del": "watcher: a new node",
    "+sadd": "watcher: a new node",
    "+srem": "extender: give a booking back",
    "+smembers": "watcher: a new node",
    "+sismember": "extender: book",
    "+hget": "watcher: a new node",
    "+hmget": "janitor: expire",  # (a give-back on a card that reads full checks its fields: add_usage)
    "+hset": "watcher: a new node",
    "+hdel": "watcher: a new node",
    "+hgetall": "watcher: a new node",
    "+hincrby": "watcher: a node's cards change",  # (a new node's version is set: bump)
}


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    s = RedisServer(password=new_password()).start()  # the default user: the admin that sets the ACL up
    yield s
    s.cleanup()


@pytest.fixture
def admin(server: RedisServer) -> Iterator[redis.Redis]:
    client = server.client()
    client.flushall()
    yield client
    with contextlib.suppress(redis.RedisError):
        client.acl_deluser(USER)
    client.close()


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MTSCHED_CONFIG", "MTSCHED_REDIS_URL", "MTSCHED_REDIS_PASSWORD", "MTSCHED_REDIS_PASSWORD_FILE"):
        monkeypatch.delenv(name, raising=False)


def grant(admin: redis.Redis, rules: tuple[str, ...]) -> None:
    """The roles' user, made anew with exactly `rules` (`reset`, and `resetchannels` for Redis 6.2: nothing else)."""
    admin.execute_command("ACL", "SETUSER", USER, "reset", "resetchannels", "on", f">{PASSWORD}", *rules)


def role_config(server: RedisServer, tmp_path: Path, prefix: str = "mt", db: int = 0) -> Config:
    """As the chart configures a role for an external Redis with an ACL user: the user in the URL, the password in
    a file (redisPasswordFile)."""
    secret = tmp_path / "redis-password"
    secret.write_text(PASSWORD + "\n")
    return load_config(env={}, flags={"redisUrl": f"redis://{USER}@127.0.0.1:{server.port}/{db}",
                                      "redisPasswordFile": str(secret), "keyPrefix": prefix})


def refused(e: BaseException | None) -> bool:
    """Whether `e`, or an error it was raised from, is Redis refusing the ACL user a command, key or channel: NOPERM,
    or (Redis 6.2 and 7.0) a script's command refused so (shared/store/redis_conn.py acl_refused)."""
    while e is not None:
        if acl_refused(e):
            return True
        e = e.__cause__ or e.__context__
    return False


def logged(admin: redis.Redis) -> set[tuple[str, str]]:
    """(reason, object) of what Redis's ACL LOG says it refused the roles' user, but redis-py's CLIENT SETINFO on
    each new connection (Redis 6.2 and 7.2+ refuse it, redis-py ignores the refusal; 7.0 knows no such command)."""
    return {(str(e["reason"]), str(e["object"])) for e in admin.acl_log()
            if e["username"] == USER and e["object"] not in ("client", "client|setinfo")}


def what_is_refused(rule: str, prefix: str = "mt") -> Callable[[set[tuple[str, str]]], bool]:
    """Whether an ACL LOG (`logged`) names what `rule` grants: its command, a key of the prefix, the feed."""
    if rule.startswith("~"):
        return lambda log: any(reason == "key" and obj.startswith(f"{prefix}:") for reason, obj in log)
    if rule.startswith("&"):
        return lambda log: ("channel", f"{prefix}:feed") in log
    return lambda log: ("command", rule[1:]) in log


@dataclass
class Roles:
    """Every role's clients for one configuration, opened as the roles open them (shared/store/session.py)."""

    cfg: Config
    admin: redis.Redis
    tmp_path: Path
    ledger: Ledger = field(init=False)
    mirror: Mirror = field(init=False)  # the extender's (and the watchers') mirror: the feed applied whole
    shapes: Mirror = field(init=False)  # the webhook's (shapes_only)
    bind_no: int = 0  # the extender's last bind attempt on u2 (give_back passes it)
    closing: list[Callable[[], Awaitable[object]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        options = RedisOptions.from_config(self.cfg)
        self.ledger = Ledger(connect(self.cfg.redis_url, options), self.cfg.key_prefix)
        webhook = Ledger(connect(self.cfg.redis_url, options), self.cfg.key_prefix)
        self.mirror = Mirror(self.ledger, subscriber=connect_subscriber(self.cfg.redis_url, options))
        self.shapes = Mirror(webhook, subscriber=connect_subscriber(self.cfg.redis_url, options), shapes_only=True)
        for client in (self.ledger.redis, webhook.redis, self.mirror.subscriber, self.shapes.subscriber):
            self.closing.append(client.aclose)

    async def close(self) -> None:
        for m in (self.mirror, self.shapes):
            with contextlib.suppress(Exception):
                await m.stop()
        for close in self.closing:
            with contextlib.suppress(Exception):
                await close()

    async def until(self, what: str, cond: Callable[[], bool], timeout: float = 5.0) -> None:
        """Wait for `cond`; a mirror whose task ended meanwhile raises what it ended with."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while not cond():
            for m in (self.mirror, self.shapes):
                if m._task is not None and m._task.done():
                    await m.stop()  # raises the error the mirror's task ended with
                    raise AssertionError(f"{what}: the mirror's task ended")
            assert loop.time() < end, f"not within {timeout}s: {what}"
            await asyncio.sleep(0.01)


A, B, GONE = "acl-a", "acl-b", "acl-gone"
KEEP_MS = 10_000  # the watchers' keep window
HOLD_MS = 6_000  # a binder's hold: its Binding's deadline and the settle time


async def load(r: Roles) -> None:
    await r.ledger.load_scripts()  # PING, SCRIPT LOAD (every role at its start: session.open_ledger)


async def new_node(r: Roles) -> None:
    # the node watcher's write of a node new to it (NodeWatcher._write_open): listed, then written whole
    for inv in (inventory(A, S4000), inventory(B, S5000, n=1), inventory(GONE, S4000, n=1)):
        await r.ledger.list_node(inv.node)
        out = await r.ledger.replace_node(inv, {}, KEEP_MS, keep_bound=True, verify_after_ms=KEEP_MS)
        assert out["verified"], out


async def node_changed(r: Roles) -> None:
    # a node's cards change (a card cordoned): upsert without creating
    assert await r.ledger.upsert_node(inventory(A, S4000, cordoned=[1]), create=False) > 0


async def subscribe(r: Roles) -> None:
    await r.mirror.start()
    await r.shapes.start()
    await r.until("the mirrors in sync", lambda: r.mirror.ready.is_set() and r.shapes.ready.is_set())
    assert set(r.mirror.nodes) == {A, B, GONE}
    assert r.shapes.capacities() == {S4000, S5000}
    # and listening: a notice on the feed (an extender's `verify`) heard by both
    heard: list[str] = []
    for m in (r.mirror, r.shapes):
        m.on_notice["verify"].append(heard.append)
    await r.ledger.notify("verify", A)
    await r.until("the notice heard", lambda: heard == [A, A])


async def book(r: Roles) -> None:
    # the extender's bind: booked with a hold (Ledger.place sends the reserve script), applied to its mirror
    out, _ = await r.ledger.reserve(A, "u1", [0], 8, 2, 1, pod="ns/p1", hold_ms=HOLD_MS)
    assert out.ok and out.bind_no == 1, out
    booked, _ = await r.ledger.reserve(A, "u2", [0], 4, 1, 1, pod="ns/p2", hold_ms=HOLD_MS)
    assert booked.ok, booked
    r.bind_no = booked.bind_no
    # a named attempt joining a booking that lists none (a binder of an older release made it, side by side during a
    # roll): reserve reads whether the booking has an attempts list (it sent HEXISTS, which these rules do not grant)
    older, _ = await r.ledger.reserve(A, "u5", [0], 2, 1, 1, pod="ns/p5")
    assert older.ok, older
    joined, _ = await r.ledger.reserve(A, "u5", [0], 2, 1, 1, pod="ns/p5", hold_ms=HOLD_MS)
    assert joined.ok and joined.existing, joined


async def feed(r: Roles) -> None:
    # the bookings' feed messages applied by both mirrors
    await r.until("the feed applied", lambda: (s := r.mirror.get(A)) is not None and "u2" in s.reservations
                  and (w := r.shapes.get(A)) is not None and w.version == s.version)
    assert r.mirror.applied >= 2 and r.shapes.applied >= 2, (r.mirror.applied, r.shapes.applied)


async def confirm(r: Roles) -> None:
    assert await r.ledger.mark_bound_many(A, ["u1"]) == []  # Confirmations._confirm
    await r.until("the mirror saw the bind", lambda: (s := r.mirror.get(A)) is not None
                  and s.reservations["u1"].state == "bound")


async def give_back(r: Roles) -> None:
    fate, message = await r.ledger.give_back(A, "u2", r.bind_no)  # a failed bind's
    assert fate == "released" and message is not None, fate
    await r.ledger.notify("wake", A)  # the extender's wake notice (InFlight)


async def upkeep_read(r: Roles) -> None:
    upkeep = Upkeep(r.ledger, r.cfg.watchers_lost_after_seconds)
    await upkeep.read()  # GET <prefix>:kept, the clock script routed by it
    assert upkeep.problem() == "", upkeep.problem()  # never stamped: no verdict


async def janitor(r: Roles) -> None:
    # a booking whose binder died, pendingTTLSeconds ago on Redis's clock (its stamps moved back by the admin)
    out, _ = await r.ledger.reserve(B, "u3", [0], S5000, 16, 1, model=S5000, whole=True, pod="ns/p3")
    assert out.ok, out
    key = r.ledger.keys.res(B, "u3")
    r.admin.hset(key, "created", int(r.admin.hget(key, "created")) - 600_000)  # type: ignore[arg-type]
    seen = Mirror(r.ledger)
    await seen.resync(full=True)
    assert await Janitor(r.ledger, seen, r.cfg).sweep() == ["u3"]  # TIME, snapshot, expire


async def pod_records(r: Roles) -> None:
    # the pod watcher: a bound pod's record (observe: HGET of the node's tombstones), an ended pod's release (its
    # tombstone: HSET, HINCRBY, and when due its trim: HGETALL, HDEL)
    out = await r.ledger.observe("u1", PodUsage(A, (0,), 8, 2, 1), "ns/p1", keep_bound=True)
    assert out.get("ok", True), out
    assert (await r.ledger.reserve(A, "u4", [0], 2, 1, 1, pod="ns/p4"))[0].ok
    assert await r.ledger.release(A, "u4", ended=True)


async def node_deleted(r: Roles) -> None:
    assert await r.ledger.remove_node(GONE, KEEP_MS) is True  # the script, then SREM from <prefix>:nodes
    assert GONE not in await r.ledger.nodes()


async def rebuild(r: Roles) -> None:
    # the watchers' start-up rebuild and the reconciler's pass: clocks, reads, rebuild (SET <prefix>:epoch)
    began = await r.ledger.clocks([A, B])
    before = (await r.ledger.reread([A, B], {}, isolate=True)).snaps
    assert set(before) == {A, B}
    bound = {"u1": (PodUsage(A, (0,), 8, 2, 1), "ns/p1")}
    stats = await r.ledger.rebuild([inventory(A, S4000), inventory(B, S5000, n=1)], bound, keep_ms=KEEP_MS,
                                   keep_bound=True, verify_after_ms=KEEP_MS, truth_at=began)
    assert stats["bound"] == 1, stats
    assert await r.ledger.intact()  # EXISTS <prefix>:epoch
    assert set(await r.ledger.nodes()) == {A, B}
    await r.ledger.redis_time_ms()
    await r.ledger.list_node(A)
    await r.ledger.announce(A)  # a node listed again: every mirror re-reads it
    assert set((await r.ledger.evicted_counts()).values()) == {0}  # INFO stats (Reconciler.evictions_reset)
    await r.ledger.partition_risk()  # INFO replication


async def stamp(r: Roles) -> None:
    await r.ledger.mark_kept()  # a ready watcher's stamp: SET <prefix>:kept on the clock script's time
    stamped, age = await r.ledger.kept()
    assert stamped is not None and age is not None and age < 5000, (stamped, age)


async def reread(r: Roles) -> None:
    # a mirror's periodic re-read: every node's (version, stamp) by HMGET, then the snapshot script where it moved
    m = Mirror(r.ledger)
    await m.resync(full=True)
    r.admin.hset(r.ledger.keys.node(A), "stamp", "0.1")  # (a write the feed missed, as the heads see it)
    await m.resync()
    assert m.read == 2 + 1, m.read
    await r.until("the running mirrors current", lambda: (s := r.mirror.get(A)) is not None
                  and "u4" not in s.reservations and GONE not in r.mirror.nodes)


async def probe(r: Roles) -> None:
    assert await r.ledger.probe_write()  # SET <prefix>:probe, INFO inside EVAL, INFO memory and stats


async def cards(r: Roles) -> None:
    args = ["cards", "--redis-url", r.cfg.redis_url, "--set", f"redisPasswordFile={r.cfg.redis_password_file}",
            "--set", f"keyPrefix={r.cfg.key_prefix}", "--log-format", "text"]
    out = r.tmp_path / "cards.out"
    code = await asyncio.to_thread(_cli, args, out)
    text = out.read_text()
    if code != 0:
        raise RuntimeError(f"mtsched cards exited {code}: {text}")
    assert A in text and B in text, text


def _cli(args: list[str], out: Path) -> int:
    """`mtsched ARGS` (its own event loop: run in a thread), what it prints in `out`; the logging it sets up undone."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        with out.open("w") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
            return cli.main(args)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


Steps = tuple[tuple[str, Callable[[Roles], Awaitable[None]]], ...]
STEPS: Steps = (  # in this order
    ("load the scripts", load),
    ("watcher: a new node", new_node),
    ("watcher: a node's cards change", node_changed),
    ("mirror: subscribe and read", subscribe),
    ("extender: book", book),
    ("mirror: apply the feed", feed),
    ("extender: confirm the bind", confirm),
    ("extender: give a booking back", give_back),
    ("extender: upkeep stamp read", upkeep_read),
    ("janitor: expire", janitor),
    ("watcher: pod records", pod_records),
    ("watcher: a node deleted", node_deleted),
    ("watcher: rebuild and reconcile", rebuild),
    ("watcher: upkeep stamp", stamp),
    ("mirror: periodic re-read", reread),
    ("readiness probe", probe),
    ("mtsched cards", cards),
)


@contextlib.asynccontextmanager
async def roles(cfg: Config, admin: redis.Redis, tmp_path: Path) -> AsyncIterator[Roles]:
    r = Roles(cfg, admin, tmp_path)
    try:
        yield r
    finally:
        await r.close()


async def first_refused(cfg: Config, admin: redis.Redis, tmp_path: Path,
                        steps: Steps = STEPS) -> tuple[str, BaseException] | None:
    """The roles' operations (`steps`) in order: None when all went through, else the first that failed and its
    error."""
    async with roles(cfg, admin, tmp_path) as r:
        for name, step in steps:
            try:
                await asyncio.wait_for(step(r), 20)
            except Exception as e:
                return name, e
    return None


@pytest.mark.parametrize("prefix", ["mt", "team-b.2_x"])
async def test_the_roles_run_with_exactly_these_rules(prefix: str, server: RedisServer, admin: redis.Redis,
                                                      tmp_path: Path) -> None:
    grant(admin, acl_rules(prefix))
    assert await first_refused(role_config(server, tmp_path, prefix), admin, tmp_path) is None
    assert logged(admin) == set()


@pytest.mark.parametrize("rule", ACL_RULES)
async def test_every_rule_is_needed(rule: str, server: RedisServer, admin: redis.Redis, tmp_path: Path) -> None:
    """The user with every rule but `rule`: the roles' operations stop at FIRST_REFUSED[rule], with Redis's refusal,
    and Redis's ACL LOG names what the rule grants."""
    grant(admin, tuple(r for r in ACL_RULES if r != rule))
    admin.acl_log_reset()
    got = await first_refused(role_config(server, tmp_path), admin, tmp_path)
    assert got is not None, f"every operation of the roles went through without {rule}: not needed"
    step, error = got
    assert refused(error), f"{step}: {type(error).__name__}: {error}"
    assert step == FIRST_REFUSED[rule], f"{step}: {error}"
    assert what_is_refused(rule)(logged(admin)), logged(admin)


def test_the_table_covers_every_rule() -> None:
    assert set(FIRST_REFUSED) == set(ACL_RULES) and len(ACL_RULES) == len(set(ACL_RULES))


async def test_redis_6_2(tmp_path: Path) -> None:
    """The oldest Redis docs/install.md names: the same rules (`resetchannels` first: 6.2's users may use every
    channel unless told, acl-pubsub-default allchannels), and nothing refused but redis-py's CLIENT SETINFO."""
    s = RedisServer(binary=str(redis62_binary()), password=new_password()).start()
    admin = s.client()
    try:
        assert str(admin.info("server")["redis_version"]).startswith("6.2.")
        grant(admin, ACL_RULES)
        assert await first_refused(role_config(s, tmp_path), admin, tmp_path) is None
        assert logged(admin) == set()
        # redis-py's CLIENT SETINFO was refused (6.2 checks the ACL before it finds no such subcommand), harmlessly
        assert any(e["object"] == "client" and e["username"] == USER for e in admin.acl_log()), admin.acl_log()
    finally:
        admin.close()
        s.cleanup()


async def test_a_database_other_than_0_needs_select(server: RedisServer, tmp_path: Path) -> None:
    """redis-py selects the URL's database on each new connection: /1 needs `+select` (refused, every connection
    fails), /0 sends no SELECT."""
    db1 = redis.Redis(port=server.port, password=server.password, db=1, decode_responses=True)
    try:
        db1.flushdb()
        grant(db1, ACL_RULES)
        got = await first_refused(role_config(server, tmp_path, db=1), db1, tmp_path)
        assert got is not None and got[0] == "load the scripts" and refused(got[1]), got
        grant(db1, (*ACL_RULES, "+select"))
        assert await first_refused(role_config(server, tmp_path, db=1), db1, tmp_path) is None
    finally:
        db1.flushdb()
        db1.close()


async def denied(rule: str, server: RedisServer, admin: redis.Redis, tmp_path: Path) -> Config:
    """A role's configuration whose user could do everything (a node is written) and now lacks `rule`."""
    grant(admin, ACL_RULES)
    cfg = role_config(server, tmp_path)
    async with roles(cfg, admin, tmp_path) as r:
        await load(r)
        await new_node(r)
    grant(admin, tuple(x for x in ACL_RULES if x != rule))
    return cfg


@pytest.mark.parametrize("rule", ["+smembers", "+hgetall"])
async def test_mtsched_cards_says_what_to_grant(rule: str, server: RedisServer, admin: redis.Redis,
                                                tmp_path: Path) -> None:
    """A read `mtsched cards` makes after its PING, refused (the node list: a command; the snapshot script's HGETALL:
    a script's command, which Redis 7.0 reports naming no command): one line naming the URL and what to grant,
    exit 2, as for a refused PING (tests/redis/test_cli_credentials.py)."""
    cfg = await denied(rule, server, admin, tmp_path)
    out = tmp_path / "cards.out"
    code = await asyncio.to_thread(_cli, ["cards", "--redis-url", cfg.redis_url, "--set",
                                          f"redisPasswordFile={cfg.redis_password_file}", "--log-format", "text"], out)
    err = out.read_text()
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and PASSWORD not in err, err
    assert err.startswith(f"mtsched cards: --redis-url {cfg.redis_url}: "), err
    assert "the Redis user may not do what the roles need" in err and "ACL LOG" in err, err


@pytest.mark.parametrize(("rule", "says"), [
    ("+script|load", "'script|load'"),  # at the start (load_scripts): the role waits, not ready
    ("+subscribe", "'subscribe'"),  # the mirror's task
    ("+hgetall", "The user executing the script"),  # the mirror's read: a script's command
    ("+eval", "'eval'"),  # the readiness probe
])
async def test_a_role_says_what_to_grant(rule: str, says: str, server: RedisServer, admin: redis.Redis,
                                         tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A role whose user lacks a rule says so in its readiness or its log, with what to grant, as `mtsched cards`
    does (before, the mirror's task and the probe said only redis-py's NoPermissionError, or a script's error naming
    no command)."""
    cfg = await denied(rule, server, admin, tmp_path)
    caplog.set_level(logging.WARNING)
    sup = Supervisor(max_failures=100)
    stop = asyncio.Event()
    task = asyncio.create_task(open_ledger(cfg, sup, stop=stop))

    def said() -> list[str]:
        lines = sup.problems() + [rec.getMessage() for rec in caplog.records]
        return [line for line in lines if "the Redis user may not do what the roles need" in line and says in line]

    try:
        loop = asyncio.get_running_loop()
        end = loop.time() + 10
        while not said():
            assert loop.time() < end, (sup.problems(), [rec.getMessage() for rec in caplog.records])
            await asyncio.sleep(0.05)
        assert "ACL LOG" in said()[0] and PASSWORD not in said()[0], said()
    finally:
        stop.set()
        opened = await asyncio.gather(task, return_exceptions=True)
        await sup.cancel()
        if not isinstance(opened[0], BaseException):
            ledger, mirror = opened[0]
            await ledger.redis.aclose()
            await mirror.subscriber.aclose()


def test_the_docs_give_these_rules() -> None:
    """docs/install.md "Redis" gives the rules as this test grants them, and points here."""
    text = (DOCS / "install.md").read_text()
    assert " ".join(ACL_RULES) in text
    assert "tests/redis/test_acl_user.py" in text


async def test_a_role_denied_a_rule_waits_unready_and_heals_once_granted(server: RedisServer, admin: redis.Redis,
                                                                          tmp_path: Path) -> None:
    """A refusal of the user's ACL is cured by granting the rule, with no restart: the role keeps trying, unready,
    saying what to grant, as it does for a wrong password; it does not give up after `max_failures` and crash-loop
    (it did: NoPermissionError and a script's refusal were not transient, shared/serving/supervise.py is_transient),
    and it is ready again once the rule is granted."""
    cfg = await denied("+subscribe", server, admin, tmp_path)
    sup = Supervisor(max_failures=2, unready_after=0.2, healthy_after=0.5)
    stop = asyncio.Event()
    ledger, mirror = await open_ledger(cfg, sup, stop=stop)
    loop = asyncio.get_running_loop()
    try:
        end = loop.time() + 15
        while sup.tasks["mirror"].restarts < 2 * sup.max_failures or not sup.problems():
            assert loop.time() < end and not sup.failed.is_set(), (sup.fatal, sup.problems())
            await asyncio.sleep(0.05)
        assert not sup.failed.is_set(), sup.fatal
        assert any("the Redis user may not do what the roles need" in p and "'subscribe'" in p
                   for p in sup.problems()), sup.problems()
        grant(admin, ACL_RULES)
        end = loop.time() + 20
        while sup.problems():
            assert loop.time() < end and not sup.failed.is_set(), (sup.fatal, sup.problems())
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await sup.cancel()
        await ledger.redis.aclose()
        await mirror.subscriber.aclose()


@pytest.mark.parametrize(("rule", "call", "names"), [
    ("+smembers", lambda ledger: ledger.nodes(), "smembers: "),  # the watchers' node list
    ("+sadd", lambda ledger: ledger.list_node("acl-new"), "sadd: "),  # a node new to the node watcher
    ("+time", lambda ledger: ledger.redis_time_ms(), "time: "),  # the clock reservations are stamped with
    ("+set", lambda ledger: ledger.mark_kept(), "kept: "),  # the upkeep stamp (its clock is a script's)
    ("+publish", lambda ledger: ledger.notify("verify", A), "publish: "),  # a notice on the feed
    ("+hgetall", lambda ledger: ledger.snapshot(A), "snapshot on acl-a: "),  # a script's command, named by node
], ids=lambda v: v if isinstance(v, str) and v.startswith("+") else "")
async def test_a_plain_command_refused_says_what_to_grant(
        rule: str, call: Callable[[Ledger], Awaitable[object]], names: str, server: RedisServer, admin: redis.Redis,
        tmp_path: Path) -> None:
    """Every round trip of the ledger (LedgerCore._retry), a plain command as a script, refused by the user's ACL is
    an AclRefusedError naming the operation and what to grant: a transient failure (the role keeps trying, unready)
    in the same words as a refused script or subscription (before, a plain command's refusal was redis-py's bare
    NoPermissionError, in the role's log and readiness)."""
    from shared.serving.supervise import is_transient
    from shared.store.ledger_core import AclRefusedError
    from shared.store.redis_conn import explain

    cfg = await denied(rule, server, admin, tmp_path)
    ledger = Ledger(connect(cfg.redis_url, RedisOptions.from_config(cfg)), cfg.key_prefix)
    try:
        with pytest.raises(AclRefusedError) as caught:
            await call(ledger)
    finally:
        await ledger.redis.aclose()
    said = str(caught.value)
    assert said.startswith(names), said
    assert "the Redis user may not do what the roles need" in said and "docs/install.md" in said, said
    assert said.count("the Redis user may not do") == 1 and PASSWORD not in said, said
    assert is_transient(caught.value) and acl_refused(caught.value)
    assert explain(caught.value) == said  # said once: a CLI or a readiness check that explains it again adds nothing
