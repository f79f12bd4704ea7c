"""Red team: a Sentinel master deposed while cut off from the sentinels and its replicas, that a role still reaches.

docs/install.md asks every Sentinel data node for `min-replicas-to-write 1`: a master cut off from its replicas
refuses writes (NOREPLICAS) rather than take bookings that its demotion would drop. The sentinels promote a replica;
the old master, which they cannot reach, stays a master that refuses writes for as long as the partition lasts (a
partial one: its zone's link to the others down, a role in its zone reaching both).

A role's pooled connections still reach the old master: redis-py asks the sentinels for the master only when it opens
a connection, and a role that never needs one more than it holds idle never opens one. Every booking, confirmation,
record and release of the role was refused NOREPLICAS, its readiness probe too, for the whole partition, while the
master the sentinels name was a connection away. READONLY from a master demoted in the sentinels' reach is redis-py's
own case (a ConnectionError, the connection dropped, sent again); NOREPLICAS from a master the sentinels replaced must
be the same.

The partition is made on real processes: the old master's password changed (the connections already authenticated,
the role's and the replica's, stay so) and the sentinels' links to it dropped, so they can no longer reach it, take
it for down, and promote a replica, which the other one follows.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

import pytest
import redis
from redis import exceptions as rexc

from deploy.local.redis import SentinelSetup, wait_until
from deploy.local.redis_server import cmd
from shared.store.ledger import Ledger, LedgerError, connect, connect_subscriber
from shared.store.mirror import Mirror
from tests.redis.helpers import S4000, eventually, inventory
from tests.redis_ha.conftest import PASSWORD

pytestmark = pytest.mark.redis_ha

CUT = "cut-off/pw"  # the old master's new password: no sentinel or replica knows it


@pytest.fixture
def setup() -> Iterator[SentinelSetup]:
    s = SentinelSetup(password=PASSWORD, replicas=2).start()  # the promoted one keeps a replica: it takes writes
    try:
        for r in s.data:  # docs/install.md "Redis": what every Sentinel data node is asked to set
            with r.client() as c:
                c.config_set("min-replicas-to-write", 1)
                c.config_set("min-replicas-max-lag", 1)
        yield s
    finally:
        s.cleanup()


def cut_off(setup: SentinelSetup) -> int:
    """The master cut off from the sentinels and its replica, still reached on the connections it has; its port."""
    old = setup.master()
    with old.client() as c:
        c.config_set("requirepass", CUT)  # (connections authenticated before stay so)
        for line in str(cmd(c, "CLIENT", "LIST")).splitlines():
            f = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
            if f.get("name", "").startswith("sentinel-"):
                cmd(c, "CLIENT", "KILL", "ID", f["id"])
    return old.port


async def replaced(setup: SentinelSetup, old_port: int) -> None:
    """Until every sentinel names another master, one that takes writes, and the old one refuses them."""
    def named_another() -> bool:  # every sentinel names another master
        ports = set()
        for i in range(len(setup.sentinel_ports)):
            with setup.sentinel_client(i) as s:
                ports.add(int(cmd(s, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", setup.service)[1]))
        return len(ports) == 1 and old_port not in ports

    await asyncio.to_thread(wait_until, named_another, 30, "the sentinels promote a replica")
    new = setup.master()
    with new.client() as c:  # a master with a replica in reach: it takes writes
        def takes_writes() -> bool:
            info = c.info("replication")
            return info["role"] == "master" and int(info.get("min_slaves_good_slaves", 0)) >= 1

        await asyncio.to_thread(wait_until, takes_writes, 20, "the promoted replica takes writes")

    def refuses() -> bool:  # the old master: a master still, its replica gone, so it refuses writes
        with redis.Redis(port=old_port, password=CUT, socket_timeout=2) as c:
            try:
                c.set("mt:probe-of-the-test", "1")
            except rexc.ResponseError as e:
                return "NOREPLICAS" in str(e)
            return False

    await asyncio.to_thread(wait_until, refuses, 15, "the old master refuses writes")


@contextlib.asynccontextmanager
async def on_a_replaced_master(setup: SentinelSetup) -> AsyncIterator[tuple[Ledger, int]]:
    """A role's ledger (node n1 written, idle connections pooled to the master), then the master cut off and
    replaced: the ledger and the old master's port."""
    led = Ledger(connect(setup.url))
    try:
        await led.load_scripts()
        await led.upsert_node(inventory("n1", S4000))
        await asyncio.gather(*(led.snapshot("n1") for _ in range(4)))  # idle connections to the master
        old_port = cut_off(setup)
        await replaced(setup, old_port)
        yield led, old_port
    finally:
        await led.redis.aclose()


async def writes_answered(led: Ledger, why: str) -> list[str]:
    """Writes sent until one is answered (at most 5, without the ledger's own resends): the refusals before it; a
    test failure, naming `why` they should have been, if none is."""
    led.retry_seconds = 0
    errors: list[str] = []
    for _ in range(5):
        try:
            # answered (on the new master the node is unverified, and refused so: an answer, not a failure)
            await led.reserve("n1", "u1", [0], 8, 2, 1, pod="ns/p1")
            await led.probe_write()
            return errors
        except (LedgerError, rexc.RedisError) as e:
            errors.append(str(e))
    pytest.fail(f"every write refused though {why}: {errors}")


async def test_a_role_leaves_a_master_the_sentinels_replaced_while_it_was_cut_off(setup: SentinelSetup) -> None:
    async with on_a_replaced_master(setup) as (led, _):
        # the role: the master the sentinels name is reachable, so its writes are answered again at once (the first
        # refusal tells the pool of the change: sent again there), not refused for the whole partition
        errors = await writes_answered(led, "the sentinels name a reachable master")
        assert not errors, errors  # not even one refused


async def test_the_master_the_sentinels_name_refusing_writes_is_answered_as_it_is(setup: SentinelSetup) -> None:
    """Its replicas out of reach, the master the sentinels name refuses: said at once, not sent again."""
    led = Ledger(connect(setup.url))
    try:
        await led.load_scripts()
        await led.upsert_node(inventory("n1", S4000))
        with setup.master().client() as c:
            c.config_set("min-replicas-to-write", 5)  # more than it has
        loop = asyncio.get_running_loop()
        t = loop.time()
        with pytest.raises(LedgerError, match="NOREPLICAS"):
            await led.reserve("n1", "u1", [0], 8, 2, 1, pod="ns/p1")
        assert loop.time() - t < led.retry_seconds  # no resends
    finally:
        await led.redis.aclose()


async def test_a_mirror_leaves_the_feed_of_a_master_the_sentinels_replaced(setup: SentinelSetup) -> None:
    """The feed too: a mirror subscribed on the old master hears nothing of what is written on the new one (its
    liveness PINGs answered there), current only through its periodic re-reads, and a watcher hears no `verify` or
    `wake` notice. It leaves it within its silence time (FEED_SILENCE_SECONDS; here 0.5 s), re-reading everything
    from the master the sentinels name."""
    writer = Ledger(connect(setup.url))
    m = Mirror(Ledger(connect(setup.url)), subscriber=connect_subscriber(setup.url), resync_seconds=3600.0,
               silence_seconds=0.5)
    try:
        await writer.load_scripts()
        await writer.upsert_node(inventory("n1", S4000))
        await m.start()
        await asyncio.wait_for(m.ready.wait(), 10)
        await asyncio.gather(*(m.ledger.snapshot("n1") for _ in range(2)))  # the mirror's reads: pooled too
        old_port = cut_off(setup)
        await replaced(setup, old_port)
        await writer.redis.connection_pool.disconnect()  # (the writer: on the new master)
        await writer.upsert_node(inventory("n1", S4000, cordoned=[1]))  # written and published there

        def seen() -> bool:
            snap = m.get("n1")
            return snap is not None and snap.cards[1].health == "cordoned"

        await eventually(seen, within=10, what="the new master's write, in the mirror")
        assert m.ready.is_set()
    finally:
        await m.stop()
        for c in (writer.redis, m.ledger.redis, m.subscriber):
            await c.aclose()
