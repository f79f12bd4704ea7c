"""Redis that fails over, under the ledger: real Sentinel and Cluster processes, masters SIGKILLed.

What holds and what does not (docs/redis-layout.md, "Sentinel and Cluster"):
* Sentinel: replication is asynchronous, so the last changes the old master acknowledged before it
  died may be missing on the new one (a booking lost, or a release lost so that a booking comes
  back). Guaranteed: the surviving state is consistent (no card booked beyond its capacity, usage
  equal to its reservations), only changes acknowledged before the failover completed can be
  missing, and the clients find the new master by themselves. `intact()` stays True (the epoch was
  replicated long before); each node's `run` is the old master's, so the new master books nothing new
  on it until the reconciler's repair from the API truth (emulated here by a rebuild or replace_node):
  a lost booking is never given to another pod.
* Cluster without replicas: a primary that dies loses its shard; the other shards go on serving and
  lose nothing. When it comes back empty, its nodes' keys are gone, which is what the watchers detect
  (`upsert_node(create=False)` answers -1) before rebuilding; `intact()` only sees it when the epoch's
  shard was the one lost.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping

import pytest

from deploy.local.redis import ClusterSetup, SentinelSetup, wait_caught_up
from deploy.local.redis62 import redis62_binary
from deploy.local.redis_server import server_major
from shared.domain.annotations import PodUsage
from shared.domain.state import NodeSnapshot
from shared.serving.supervise import is_transient
from shared.store.ledger import UNVERIFIED, Ledger, connect, connect_subscriber
from shared.store.mirror import Mirror
from tests.redis.helpers import S4000, S5000, all_violations, eventually, expected_usage, inventory
from tests.redis.test_stress import CAPACITY, INVENTORIES, assert_ledger_matches, assert_nothing_booked
from tests.redis_ha.burst import Burst
from tests.redis_ha.conftest import PASSWORD

pytestmark = pytest.mark.redis_ha

LIMITS = {(i.node, c.index): (c.capacity, 16, c.max_slices) for i in INVENTORIES for c in i.cards}


def overcommitted(truth: Mapping[str, PodUsage]) -> set[tuple[str, int]]:
    """Cards that what the pods really hold (the API's truth) books beyond their capacity."""
    return {card for card, used in expected_usage(truth.values()).items()
            if any(u > limit for u, limit in zip(used, LIMITS[card], strict=True))}


def bookings(snaps: Mapping[str, NodeSnapshot]) -> set[tuple[str, PodUsage]]:
    """(uid, what it books) for every reservation; one uid may be booked on two nodes after a
    failover (its first answer was lost, the retry went elsewhere; the janitor expires the other)."""
    return {(uid, PodUsage(n, r.cards, r.mem, r.cores, r.slices)) for n, s in snaps.items()
            for uid, r in s.reservations.items()}


@contextlib.asynccontextmanager
async def watched(url: str, feed_url: str | None = None) -> AsyncIterator[tuple[Ledger, Mirror]]:
    """A ledger client and a started mirror on it, subscribed as the roles do (to `feed_url` if given)."""
    led, sub = Ledger(connect(url)), connect_subscriber(feed_url or url)
    mirror = Mirror(led, subscriber=sub)
    try:
        await mirror.start()
        await asyncio.wait_for(mirror.ready.wait(), 10)
        yield led, mirror
    finally:
        await mirror.stop()
        await sub.aclose()
        await led.redis.aclose()


async def in_sync(led: Ledger, mirror: Mirror, nodes: list[str], what: str) -> None:
    async def synced() -> bool:
        return mirror.ready.is_set() and mirror.nodes == await led.snapshots(nodes)

    await eventually(synced, within=20, what=what)


async def start_sentinel(binary: str | None = None) -> SentinelSetup:
    return await asyncio.to_thread(SentinelSetup(password=PASSWORD, binary=binary).start)


async def start_cluster(binary: str | None = None) -> ClusterSetup:
    return await asyncio.to_thread(ClusterSetup(password=PASSWORD, binary=binary).start)


@pytest.fixture(params=["debian", "6.2"])
def redis_binary(request: pytest.FixtureRequest) -> str | None:
    """Each failover on the Debian package's redis-server (7.x) and on 6.2, the oldest release docs/install.md
    names (deploy/local/redis62.py)."""
    return None if request.param == "debian" else str(redis62_binary())


async def test_sentinel_mirror_follows_a_failover(redis_binary: str | None) -> None:
    setup = await start_sentinel(redis_binary)
    burst = Burst(setup.url, {})  # only for its retrying()
    try:
        async with watched(setup.url) as (led, mirror):
            await led.upsert_node(inventory("n4", S4000))
            await led.upsert_node(inventory("n5", S5000))
            assert (await led.reserve("n4", "u1", [0], 8, 2, 1))[0].ok
            await asyncio.to_thread(wait_caught_up, setup.master())  # u1 reached the replica
            await in_sync(led, mirror, ["n4", "n5"], "the mirror sees u1")
            old = await asyncio.to_thread(setup.kill_master)
            new = await asyncio.to_thread(setup.wait_failover, old)
            with new.client() as c:  # scripts are not replicated: the first call on the new master reloads them
                # Redis 7 replicates no script (the client loads it again on NOSCRIPT); 6.2 replicated them
                assert c.script_exists(led._scripts["reserve"].sha) == [server_major(redis_binary or "") < 7]
            # the new master may lack the old one's last writes: no new booking until the node is compared
            out, _ = await burst.retrying(lambda: led.reserve("n5", "u2", [1], 16, 4, 1))
            assert not out.ok and out.refused.startswith(UNVERIFIED), out
            await led.replace_node(inventory("n5", S5000), {}, verify_after_ms=0)  # the watchers' first comparison
            assert not (await led.snapshot("n5")).verified  # type: ignore[union-attr]  # a view verifies nothing
            began = (await led.clocks(["n5"]))["n5"]  # the second: a consistent read of the pods, begun then
            await led.replace_node(inventory("n5", S5000), {}, verify_after_ms=0, truth_at=began)
            out, _ = await led.reserve("n5", "u2", [1], 16, 4, 1)
            assert out.ok
            with new.client() as c:  # the client found the new master
                assert c.exists("mt:{n5}:res:u2") == 1
            # the mirror re-subscribed on the new master and re-read: it holds u1 (replicated) and u2
            await in_sync(led, mirror, ["n4", "n5"], "the mirror equals the new master's ledger")
            assert "u1" in mirror.nodes["n4"].reservations and "u2" in mirror.nodes["n5"].reservations
    finally:
        await asyncio.to_thread(setup.cleanup)


async def test_cluster_mirror_survives_the_death_of_its_node_and_rereads_a_lost_shard(redis_binary: str | None) -> None:
    setup = await start_cluster(redis_binary)
    burst = Burst(setup.url, {})
    try:
        # n5 on the first shard, n4 on the second; the mirror's feed connection starts on the third
        owners = [setup.owner_of(f"mt:{{{n}}}:node") for n in ("n5", "n4", "nerr")]
        assert len({o.port for o in owners}) == 3
        spare = owners[2]
        async with watched(setup.url, setup.url.replace(str(setup.nodes[0].port), str(spare.port))) as (led, mirror):
            invs = [inventory("n4", S4000), inventory("n5", S5000)]
            await led.rebuild(invs, {})
            await in_sync(led, mirror, ["n4", "n5"], "the mirror has both nodes")
            # The node the mirror listens on dies (it holds none of the ledger's nodes): the feed is
            # broadcast to every node, so the subscriber goes to another one and the mirror follows on.
            await asyncio.to_thread(spare.kill)
            assert (await burst.retrying(lambda: led.reserve("n4", "u1", [0], 8, 2, 1)))[0].ok
            await eventually(lambda: mirror.ready.is_set() and "u1" in mirror.nodes["n4"].reservations, within=20,
                             what="the mirror follows the feed from another node")
            await asyncio.to_thread(setup.restart, spare)
            # n4's primary crashes and comes back empty: n4's keys are gone, which the watchers detect ...
            shard = setup.owner_of(led.node_key("n4"))
            await asyncio.to_thread(shard.kill)
            await asyncio.to_thread(setup.restart, shard)
            await asyncio.to_thread(setup.wait_healthy)
            assert await burst.retrying(lambda: led.snapshot("n4")) is None
            assert await led.upsert_node(invs[0], create=False) == -1
            # ... and rebuild from the API's truth; the mirror re-reads the rebuilt nodes
            await led.rebuild(invs, {"u1": (PodUsage("n4", (0,), 8, 2, 1), "ns/p1")})
            await in_sync(led, mirror, ["n4", "n5"], "the mirror equals the rebuilt ledger")
            assert mirror.nodes["n4"].reservations["u1"].state == "bound"
    finally:
        await asyncio.to_thread(setup.cleanup)


async def test_sentinel_master_killed_mid_burst(redis_binary: str | None) -> None:
    """6 workers book, bind and release on 3 nodes x 2 cards while the master is SIGKILLed."""
    setup = await start_sentinel(redis_binary)
    led = Ledger(connect(setup.url))
    # pods live long enough that many are still held when the burst stops (their bookings may be the lost ones)
    burst = Burst(setup.url, CAPACITY, workers=6, seed=11, lifetime=(1.0, 6.0))
    loop = asyncio.get_running_loop()
    try:
        await led.rebuild(INVENTORIES, {})
        await asyncio.to_thread(wait_caught_up, setup.master())  # the epoch is on the replica
        run = asyncio.create_task(burst.run())
        await eventually(lambda: len(burst.acks) >= 50, within=20, what="the burst is under way")
        old = await asyncio.to_thread(setup.kill_master)
        await asyncio.to_thread(setup.wait_failover, old)
        done = loop.time()
        # the new master refuses every new booking (each node's `run` is the old master's) until the watchers
        # compare the node with the API: a booking it lost cannot be given to another pod meanwhile
        await eventually(lambda: sum(1 for t in burst.unverified if t > done) >= 20, within=20,
                         what="the workers meet the fence")
        burst.stop.set()
        await run
        assert burst.unavailable > 0  # the workers did meet the failover
        assert not [t for t in burst.placed if t > done], "a new booking was made before the nodes were compared"

        snaps = await burst.retrying(lambda: led.snapshots([i.node for i in INVENTORIES]))
        assert all_violations(snaps) == []  # what survived is consistent: no card beyond capacity
        truth = burst.truth()
        lost = set(truth.items()) - bookings(snaps)
        back = bookings(snaps) - set(truth.items())
        # only what the old master acknowledged before the failover completed may be missing, and a
        # booking nobody holds is a lost release, or a booking whose answer was lost with the master
        assert all(burst.held[uid].acked < done for uid, _u in lost)
        assert all(min(burst.released.get(uid, done), burst.unanswered.get(uid, done)) < done for uid, _u in back)
        # no card is over-committed by what the pods really hold, lost bookings or not: none was booked again
        assert overcommitted(truth) == set()
        assert await led.intact()  # the epoch survived: this kind of loss is not flagged by intact()
        print(f"\nsentinel failover: {len(truth)} held, {len(lost)} bookings lost, {len(back)} nobody holds, "
              f"{burst.unavailable} calls sent again, {len(burst.acks)} changes")

        # the repair from the API's truth (the reconciler's, after a reconnect) ...
        held = {uid: (u, f"default/{uid}") for uid, u in truth.items()}
        await led.rebuild(INVENTORIES, held, verify_after_ms=0)  # the first comparison: the keep window starts
        assert not any(s.verified for s in (await led.snapshots(await led.nodes())).values())
        began = await led.clocks(inv.node for inv in INVENTORIES)  # the second, a consistent read begun then
        await led.rebuild(INVENTORIES, held, verify_after_ms=0, truth_at=began)
        snaps = await led.snapshots(await led.nodes())
        extra = bookings(snaps) - set(truth.items())
        assert set(truth.items()) <= bookings(snaps)
        # what nobody holds is kept only if pending (the janitor's TTL ends it); bound ones are dropped
        assert all(snaps[u.node].reservations[uid].state == "pending" for uid, u in extra)
        assert all(s.verified for s in snaps.values())  # compared: bookings are made again
        # ... then every pod goes, and the janitor expires what is left pending (after a TTL of 1 s)
        for uid, u in truth.items():
            assert await led.release(u.node, uid)

        async def expired() -> bool:
            return not any([await led.expire(i.node, 1.0) for i in INVENTORIES]) and \
                not bookings(await led.snapshots(await led.nodes()))

        await eventually(expired, within=10, what="what was left pending has expired")
        await assert_nothing_booked(led)
    finally:
        burst.stop.set()
        await led.redis.aclose()
        await asyncio.to_thread(setup.cleanup)


async def test_sentinel_promotes_an_empty_replica_and_the_epoch_says_so(redis_binary: str | None) -> None:
    """The replica crashed too and came back empty just before the master died: Sentinel promotes it
    (it is the only one), everything is lost, and the missing epoch is what tells the watchers."""
    setup = await start_sentinel(redis_binary)
    led = Ledger(connect(setup.url))
    burst = Burst(setup.url, {})
    try:
        truth = {"u1": PodUsage("s4000-a", (0,), 8, 2, 1), "u2": PodUsage("s5000-b", (0, 1), S5000, 16, 1)}
        await led.rebuild(INVENTORIES, {})
        for uid, u in truth.items():
            assert (await led.reserve(u.node, uid, u.cards, u.memory, u.cores, u.slices,
                                      whole=len(u.cards) > 1))[0].ok
        master, replica = setup.master(), next(r for r in setup.data if r is not setup.master())
        await asyncio.to_thread(replica.kill)
        await asyncio.to_thread(master.kill)
        await asyncio.to_thread(replica.start)  # empty, and its master is gone: nothing to sync from
        await asyncio.to_thread(setup.wait_failover, master)
        assert not await burst.retrying(led.intact)  # detected: the epoch is gone
        assert await led.snapshots([i.node for i in INVENTORIES]) == {}
        # the watchers' rebuild from the API's truth
        await led.rebuild(INVENTORIES, {uid: (u, f"default/{uid}") for uid, u in truth.items()})
        assert await led.intact()
        await assert_ledger_matches(led, truth, all_bound=True)
    finally:
        await led.redis.aclose()
        await asyncio.to_thread(setup.cleanup)


async def test_cluster_primary_lost_mid_burst(redis_binary: str | None) -> None:
    """6 workers book, bind and release on 3 nodes over the 3 shards while one primary is SIGKILLed
    and started again, empty."""
    setup = await start_cluster(redis_binary)
    led = Ledger(connect(setup.url))
    burst = Burst(setup.url, CAPACITY, workers=6, seed=12)
    loop = asyncio.get_running_loop()
    victim = setup.owner_of(led.node_key("s4000-c"))
    gone = {i.node for i in INVENTORIES if setup.owner_of(led.node_key(i.node)) is victim}
    assert gone == {"s4000-c"} and setup.owner_of(led.epoch_key) is not victim
    try:
        await led.rebuild(INVENTORIES, {})
        run = asyncio.create_task(burst.run())
        await eventually(lambda: len(burst.acks) >= 50 and any(u.node in gone for u in burst.truth().values()),
                         within=20, what="the burst is under way, with bookings on the shard to lose")
        killed = loop.time()
        await asyncio.to_thread(victim.kill)
        await eventually(lambda: burst.acked_after(killed) >= 10, within=20, what="the other shards go on")
        await asyncio.to_thread(setup.restart, victim)
        await asyncio.to_thread(setup.wait_healthy)
        back = loop.time()
        await eventually(lambda: burst.acked_after(back) >= 20, within=20, what="the burst goes on")
        burst.stop.set()
        await run
        assert burst.unavailable > 0

        # detected: the node's keys are gone (the epoch lives on another shard, so intact() holds)
        assert await led.intact()
        assert await led.snapshot("s4000-c") is None
        assert await led.upsert_node(INVENTORIES[2], create=False) == -1
        # the other shards lost nothing: they hold exactly what the workers hold there
        truth = burst.truth()
        snaps = await led.snapshots(await led.nodes())
        assert sorted(snaps) == sorted(set(CAPACITY) - gone) and all_violations(snaps) == []
        assert bookings(snaps) == {(uid, u) for uid, u in truth.items() if u.node not in gone}
        # what was held on the lost shard was booked before it died (after, it refused bookings);
        # what was released since found nothing to release
        assert all(burst.held[uid].acked < back for uid, u in truth.items() if u.node in gone)
        assert burst.release_missed or any(u.node in gone for u in truth.values())
        assert overcommitted(truth) == set()
        print(f"\ncluster primary lost: {len(truth)} held, {sum(u.node in gone for u in truth.values())} on "
              f"the lost shard, {len(burst.release_missed)} releases found nothing, "
              f"{burst.unavailable} calls sent again, {len(burst.acks)} changes")

        # the watchers' rebuild from the API's truth gives exactly that truth back
        await led.rebuild(INVENTORIES, {uid: (u, f"default/{uid}") for uid, u in truth.items()})
        await assert_ledger_matches(led, truth, all_bound=True)
        for uid, u in truth.items():
            assert await led.release(u.node, uid)
        await assert_nothing_booked(led)
    finally:
        burst.stop.set()
        await led.redis.aclose()
        await asyncio.to_thread(setup.cleanup)


async def test_cluster_replica_takes_over_a_killed_primary(redis_binary: str | None) -> None:
    """A replica per primary: the ledger's client follows the promoted replica (and loads the scripts
    there), n4's bookings replicated before the kill are kept, and the mirror converges."""
    setup = await asyncio.to_thread(ClusterSetup(password=PASSWORD, replicas=1, binary=redis_binary).start)
    burst = Burst(setup.url, {})
    nodes = ["n4", "n5", "nerr"]  # one per shard
    try:
        async with watched(setup.url) as (led, mirror):
            await led.rebuild([inventory(n, S4000) for n in nodes], {})
            assert (await led.reserve("n4", "u1", [0], 8, 2, 1))[0].ok
            old = setup.owner_of(led.node_key("n4"))
            await asyncio.to_thread(wait_caught_up, old)
            await asyncio.to_thread(old.kill)
            await asyncio.to_thread(setup.wait_failover, old)
            new = setup.owner_of(led.node_key("n4"))
            assert new is not old
            with new.client() as c:
                # Redis 7 replicates no script (the client loads it again on NOSCRIPT); 6.2 replicated them
                assert c.script_exists(led._scripts["reserve"].sha) == [server_major(redis_binary or "") < 7]
            refused = (await burst.retrying(lambda: led.reserve("n4", "u2", [1], 16, 4, 1)))[0]
            assert not refused.ok and refused.refused.startswith(UNVERIFIED)  # fenced until compared
            assert not (await led.snapshot("n4")).verified  # type: ignore[union-attr]
            assert (await led.snapshot("n5")).verified  # type: ignore[union-attr]  # another shard: as it was
            await led.replace_node(inventory("n4", S4000), {}, verify_after_ms=0)  # the first comparison (u1: kept)
            assert not (await led.snapshot("n4")).verified  # type: ignore[union-attr]
            began = (await led.clocks(["n4"]))["n4"]  # on n4's shard: the second, a consistent read begun then
            await led.replace_node(inventory("n4", S4000), {}, verify_after_ms=0, truth_at=began)
            assert (await led.reserve("n4", "u2", [1], 16, 4, 1))[0].ok
            snap = await led.snapshot("n4")
            assert snap is not None and sorted(snap.reservations) == ["u1", "u2"]
            assert await led.intact()
            await in_sync(led, mirror, nodes, "the mirror equals the ledger after the failover")
    finally:
        await asyncio.to_thread(setup.cleanup)


async def test_cluster_mirror_reads_a_promoted_replica_before_any_other_call_loads_the_scripts_there(
        redis_binary: str | None) -> None:
    """A mirror whose reads are the first calls to reach a promoted replica (Redis 7 replicates no script): each read
    answered NOSCRIPT, and redis-py's own SCRIPT LOAD went to the primaries its node list named, so every resync
    ended in "kept changing" (a LedgerError, no transient error) until something else loaded the script there (a
    red team's probe: 39 such failures in 12 s, 1 read). The snapshot script is now loaded where the keys live."""
    setup = await asyncio.to_thread(ClusterSetup(password=PASSWORD, replicas=1, binary=redis_binary).start)
    names = [f"n{i}" for i in range(30)]
    led, mled = Ledger(connect(setup.url)), Ledger(connect(setup.url))
    mled.retry_seconds, mled.connection_retries = 0.2, 0
    mirror = Mirror(mled)
    try:
        await led.rebuild([inventory(n, S4000) for n in names], {})
        await mirror.resync(full=True)
        old = setup.owner_of(led.node_key("n5"))
        await asyncio.to_thread(wait_caught_up, old)
        await asyncio.to_thread(old.kill)
        errors: list[BaseException] = []

        async def read() -> bool:
            try:
                await mirror.resync(full=True)  # (only the mirror calls the promoted replica)
            except Exception as e:  # every error is judged below
                errors.append(e)
                await asyncio.sleep(0.05)
                return False
            return True

        # read while the failover is under way, as a role does (the client's view of the cluster is then taken
        # before the replica is promoted), until a read goes through (n5's shard: only once it is promoted)
        await eventually(read, within=60, what="a full read of the mirror after the failover")
        await asyncio.to_thread(setup.wait_failover, old)  # (every node's view of the slots settled)
        assert setup.owner_of(led.node_key("n5")) is not old
        assert set(mirror.nodes) == set(names)
        assert not [e for e in errors if not is_transient(e)], errors[:3]  # Redis unavailable meanwhile, only
    finally:
        await led.redis.aclose()
        await mled.redis.aclose()
        await asyncio.to_thread(setup.cleanup)
