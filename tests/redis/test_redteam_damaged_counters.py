"""Red team: the counters the scripts bump with HINCRBY, damaged by a hand edit (docs/redis-layout.md): a node's
`version` and its tombstones' `#n` not a whole number, or one at the end of Redis's 64-bit range. HINCRBY refuses
both ("hash value is not an integer", "increment or decrement would overflow"), so every script that writes the
node (it bumps `version` when it publishes) failed, for ever: no booking, release or confirmation there, and the
reconciler's repair of the node (replace_node) failed too, every pass, until its supervisor gave up (a crash loop
of the watchers). Likewise the release of every pod that ended on the node (its tombstone bumps `#n`), which the pod
watcher sends again and again. A damaged counter now starts again, as `bind_seq` already did: `version` from 0
(its new `stamp` tells the mirrors it is another write: they read the node again), `#n` from the tombstones' own
count (0 here)."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis.helpers import violations
from tests.redis.test_reconcile_touched import setup

pytestmark = pytest.mark.redis

DAMAGED = ["abc", "1.5", "-3", "9223372036854775807", "99999999999999999999999"]


@pytest.mark.parametrize("value", DAMAGED)
async def test_a_damaged_version_starts_again(ledger: Ledger, redis_client: Redis, value: str) -> None:
    rec, _pods = await setup(ledger)
    mirror = Mirror(Ledger(redis_client))
    await mirror.resync(full=True)
    assert (await ledger.reserve("ta", "u1", [0], 8, 2, 1, pod="ns/p1"))[0].ok
    await redis_client.hset(ledger.keys.node("ta"), "version", value)  # type: ignore[misc]
    booked = (await ledger.reserve("ta", "u2", [1], 8, 2, 1, pod="ns/p2"))[0]  # before: LedgerError, every time
    assert booked.ok, booked
    assert await ledger.release("ta", "u2")
    await redis_client.hset(ledger.keys.node("ta"), "version", value)  # type: ignore[misc]
    await redis_client.hset(ledger.keys.card("ta", 1), "mem_used", 50)  # type: ignore[misc]  # a drift to repair
    assert await rec.reconcile_all()  # the repair writes the node (before: failed, every pass)
    snap = (await ledger.snapshots(["ta"]))["ta"]
    assert violations(snap) == [] and snap.cards[1].mem_used == 0 and 0 < snap.version < 2 ** 52
    await mirror.resync()  # a mirror that held the node before its damage reads it again (its stamp moved on)
    assert mirror.nodes["ta"].cards[1].mem_used == 0 and mirror.nodes["ta"].version == snap.version


@pytest.mark.parametrize("value", DAMAGED)
async def test_a_damaged_tombstone_count_starts_again(ledger: Ledger, redis_client: Redis, value: str) -> None:
    await setup(ledger)
    assert (await ledger.reserve("ta", "u1", [0], 8, 2, 1, pod="ns/p1"))[0].ok
    await redis_client.hset(ledger.keys.ended("ta"), "#n", value)  # type: ignore[misc]
    assert await ledger.release("ta", "u1", ended=True)  # before: LedgerError, every time the watcher sent it
    assert await redis_client.hget(ledger.keys.ended("ta"), "u1")  # type: ignore[misc]  # tombstoned
    n = await redis_client.hget(ledger.keys.ended("ta"), "#n")  # type: ignore[misc]
    assert n is not None and 0 < int(n) < 2 ** 52


@pytest.mark.parametrize("value", ["inf", "1e400", "-inf"])
async def test_an_infinite_version_or_knob_does_not_fail_every_read(ledger: Ledger, redis_client: Redis,
                                                                    value: str) -> None:
    """A node's `version`, or a card knob (`policy`, `time_slice`, `overcommit_ratio`), that Lua reads as infinite
    made every snapshot of the node fail (cjson refuses to encode it: "Cannot serialise number"), and with it every
    pipelined read holding the node: every mirror's resync and every reconciler pass, until their supervisors gave
    up. Now a damaged version reads as 0 and such a knob as none."""
    rec, _pods = await setup(ledger)
    await redis_client.hset(ledger.keys.card("ta", 0), "time_slice", value)  # type: ignore[misc]
    snaps = await ledger.snapshots(["ta", "tb"])  # before: LedgerError, the whole read
    assert snaps["ta"].cards[0].time_slice is None and "tb" in snaps
    await redis_client.hset(ledger.keys.node("ta"), "version", value)  # type: ignore[misc]
    snaps = await ledger.snapshots(["ta", "tb"])
    assert snaps["ta"].version == 0 and "tb" in snaps
    await rec.reconcile_all()
    assert (await ledger.reserve("ta", "u1", [0], 8, 2, 1, pod="ns/p1"))[0].ok


async def test_a_node_with_a_damaged_version_can_be_removed(ledger: Ledger, redis_client: Redis) -> None:
    """remove_node added 1 to the version read with tonumber: "abc" failed it ("attempt to perform arithmetic on a nil
    value"), so a node deleted from the API stayed in the ledger, its removal failing every time it was tried."""
    await setup(ledger)
    await redis_client.hset(ledger.keys.node("ta"), "version", "abc")  # type: ignore[misc]
    assert await ledger.remove_node("ta")
    assert await redis_client.exists(ledger.keys.node("ta")) == 0


@pytest.mark.parametrize("value", ["abc", ""])
async def test_a_damaged_trim_mark_does_not_fail_the_release_of_an_ended_pod(ledger: Ledger, redis_client: Redis,
                                                                            value: str) -> None:
    """The tombstones' `#trim_at` not a number made the release of every pod that ended on the node fail ("attempt
    to compare nil with number"), for ever: the pod watcher sent it again and again. It now trims at once."""
    await setup(ledger)
    assert (await ledger.reserve("ta", "u1", [0], 8, 2, 1, pod="ns/p1"))[0].ok
    await redis_client.hset(ledger.keys.ended("ta"), "#trim_at", value)  # type: ignore[misc]
    assert await ledger.release("ta", "u1", ended=True)
    assert await redis_client.hget(ledger.keys.ended("ta"), "u1")  # type: ignore[misc]


async def test_a_reservation_naming_a_huge_card_index_does_not_fail_every_read(ledger: Ledger,
                                                                             redis_client: Redis) -> None:
    """A reservation's `cards` naming an index past Lua's exact integers (99999999999999999999999) was carried by
    replace_node as "1e+23", a card the node then listed, and every snapshot of the node failed to decode (int()),
    every pipelined read holding it with it. An index beyond upsert_node's 0..1023 now names no card."""
    rec, _pods = await setup(ledger)
    assert (await ledger.reserve("ta", "u1", [0], 8, 2, 1, pod="ns/p1"))[0].ok
    await redis_client.hset(ledger.keys.res("ta", "u1"), "cards", "99999999999999999999999")  # type: ignore[misc]
    await rec.reconcile_all()
    snaps = await ledger.snapshots(["ta", "tb"])  # before: ValueError, the whole read
    assert sorted(snaps["ta"].cards) == [0, 1] and "tb" in snaps
