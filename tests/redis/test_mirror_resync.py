"""A mirror's periodic resync reads only what it must (real Redis).

Each scripted write of a node stamps it (version, stamp: Redis's clock at the write). A periodic resync
reads every node's (version, stamp) with one HMGET each and re-reads only the nodes whose last write is not
the one the mirror holds; every FULL_EVERY-th resync reads every node. A reply that is the very text last
read for a node, which nothing changed here since, is not decoded again. Unchanged nodes keep their
snapshot objects and tell no listener.

The mirrors here are never started: their feed is never applied, as if every message were lost, so only
the resync can bring them up to date."""

from __future__ import annotations

import dataclasses

import pytest
from redis.asyncio import Redis

from shared.store import mirror as mirror_module
from shared.store.ledger import Ledger, Reread
from shared.store.mirror import FULL_EVERY, Mirror
from tests.redis.helpers import S5000, inventory, periodic, truth

pytestmark = pytest.mark.redis


async def test_a_resync_reads_only_the_nodes_whose_last_write_it_does_not_hold(
        populated: Ledger, mirror: Mirror) -> None:
    led = populated
    await mirror.resync(full=True)
    assert mirror.nodes == await truth(led) and mirror.read == 4 and mirror.decoded == 4  # n4, n5, nx, nerr
    assert all(s.stamp for s in mirror.nodes.values())  # every node carries its last write's stamp
    before = dict(mirror.nodes)
    told: list[str] = []
    mirror.on_change.append(told.append)

    periodic(mirror)
    await mirror.resync()
    assert mirror.read == 4 and told == []  # nothing changed: nothing read, nobody told
    assert all(mirror.nodes[n] is before[n] for n in before)  # the same objects: derived memos stay valid

    assert (await led.reserve("n5", "u9", [1], 8, 2, 1, pod="ns/p9"))[0].ok  # its feed message is lost here
    periodic(mirror)
    await mirror.resync()
    assert mirror.nodes == await truth(led)
    assert mirror.read == 5 and told == ["n5"]  # only n5 read anew
    assert "u9" in mirror.nodes["n5"].reservations
    assert all(mirror.nodes[n] is before[n] for n in before if n != "n5")

    await mirror.resync(full=True)  # after a lost connection: every node read and decoded
    assert mirror.read == 9 and mirror.decoded == 9 and mirror.nodes == await truth(led)


async def test_a_write_that_restarts_the_version_count_is_read(populated: Ledger, mirror: Mirror,
                                                               redis_client: Redis) -> None:
    """A shard that failed over to a lagging replica counts a node's versions again from an older one, so the
    mirror's version can come back with other content. The stamp names the write: the node is read. Here the
    lost write's version is set back by hand, as the replica would have it."""
    led = populated
    await mirror.resync(full=True)
    held = mirror.nodes["n4"]
    assert (await led.reserve("n4", "u9", [1], 8, 2, 1, pod="ns/p9"))[0].ok  # the lost write
    await redis_client.hset(led.node_key("n4"), "version", held.version)  # type: ignore[misc]
    periodic(mirror)
    await mirror.resync()
    assert "u9" in mirror.nodes["n4"].reservations and mirror.nodes == await truth(led)


async def test_a_node_without_a_stamp_is_always_read(populated: Ledger, mirror: Mirror, redis_client: Redis) -> None:
    """Keys written before stamps existed: (version, "") names no write, so the node is read every time, until
    its next write stamps it."""
    led = populated
    await redis_client.hdel(led.node_key("nx"), "stamp")  # type: ignore[misc]
    await mirror.resync(full=True)
    assert mirror.nodes["nx"].stamp == ""
    for _ in range(2):
        periodic(mirror)
        read = mirror.read
        await mirror.resync()
        assert mirror.read == read + 1  # nx only
    assert await led.release("nx", "ux")  # its next write stamps it
    periodic(mirror)
    await mirror.resync()  # read once more: the one held here still has no stamp
    assert mirror.nodes["nx"].stamp and mirror.nodes == await truth(led)
    periodic(mirror)
    read = mirror.read
    await mirror.resync()
    assert mirror.read == read  # from now on, read only when written


async def test_what_no_write_explains_is_read_within_full_every_resyncs(populated: Ledger, mirror: Mirror) -> None:
    """A snapshot here that differs from the ledger under the same last write (here a forged one; in life a
    misapplied message) is not seen by the (version, stamp) check, and is replaced by the ledger's at the next
    resync that reads every node: within FULL_EVERY periodic resyncs."""
    led = populated
    await mirror.resync(full=True)
    mirror.put(dataclasses.replace(mirror.nodes["n4"], reservations={}))
    resyncs = 0
    while mirror.nodes != await truth(led):
        await mirror.resync()
        resyncs += 1
        assert resyncs <= FULL_EVERY
    assert set(mirror.nodes["n4"].reservations) == {"u1", "u2"}
    assert resyncs == FULL_EVERY - 1  # the full resync was the mirror's 10th; the first one, full=True


async def test_a_full_read_decodes_only_replies_that_changed(populated: Ledger, mirror: Mirror) -> None:
    led = populated
    await mirror.resync(full=True)
    while (mirror.resyncs + 1) % FULL_EVERY:
        mirror.resyncs += 1  # the next resync reads every node
    assert (await led.reserve("n5", "u9", [1], 8, 2, 1, pod="ns/p9"))[0].ok
    decoded, read = mirror.decoded, mirror.read
    await mirror.resync()
    assert mirror.read == read + 4 and mirror.decoded == decoded + 1  # every node read, n5 decoded
    assert mirror.nodes == await truth(led)


async def test_a_change_here_while_reading_keeps_the_newer_snapshot_and_no_digest(
        populated: Ledger, mirror: Mirror, monkeypatch: pytest.MonkeyPatch) -> None:
    """The resync awaits Redis many times, and the extender's bind may apply a feed message meanwhile: a node
    whose reply was the text last read keeps that newer local snapshot (it is not older than the read), and
    its digest is dropped, since the digest no longer describes it."""
    led = populated
    await mirror.resync(full=True)
    newer = dataclasses.replace(mirror.nodes["n5"], version=mirror.nodes["n5"].version + 1)
    real = mirror.ledger.reread

    async def reread_then_apply(nodes: list[str], previous: dict[str, int],
                  isolate: bool = False, apart: object = ()) -> Reread:
        out = await real(nodes, previous, isolate, apart)  # type: ignore[arg-type]
        assert "n5" in out.unchanged
        mirror.put(newer)  # as a bind applying its booking's message between the read and the install
        return out

    monkeypatch.setattr(mirror.ledger, "reread", reread_then_apply)
    monkeypatch.setattr(mirror_module, "FULL_EVERY", 1)  # every resync reads every node
    await mirror.resync()
    assert mirror.nodes["n5"] is newer
    monkeypatch.setattr(mirror.ledger, "reread", real)
    decoded = mirror.decoded
    await mirror.resync()  # n5 decoded again (no digest): the ledger's own value comes back
    assert mirror.nodes == await truth(led) and mirror.decoded == decoded + 1


async def test_a_booking_applied_here_while_reading_is_not_undone_by_the_older_read(
        populated: Ledger, mirror: Mirror, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node whose reply changed is read before the extender books on it, and the booking's message (the
    script's reply) is applied here before the read is installed: the mirror keeps the booking. Before, the
    older read was installed and the booking hidden until the feed's copy came, so a filter in between
    offered its cards again."""
    led = populated
    await mirror.resync(full=True)
    assert (await led.reserve("n5", "u1", [1], 8, 2, 1, pod="ns/p1"))[0].ok  # its message lost: n5 is read
    real = mirror.ledger.reread
    booked: list[str] = []

    async def reread_then_book(nodes: list[str], previous: dict[str, int],
                  isolate: bool = False, apart: object = ()) -> Reread:
        out = await real(nodes, previous, isolate, apart)  # type: ignore[arg-type]
        assert "n5" in out.snaps and "u1" in out.snaps["n5"].reservations
        outcome, _ = await led.reserve("n5", "u2", [1], 8, 2, 1, pod="ns/p2")  # the bind, after the read
        assert outcome.ok and outcome.feed is not None
        mirror.nodes["n5"] = out.snaps["n5"]  # as if the feed had brought u1 meanwhile: u2 follows it
        assert mirror.apply(outcome.feed) is None  # the extender's _apply_feed
        booked.append("u2")
        return out

    monkeypatch.setattr(mirror.ledger, "reread", reread_then_book)
    await mirror.resync()
    assert booked and {"u1", "u2"} <= set(mirror.nodes["n5"].reservations)
    assert "n5" not in mirror.digests(["n5"])  # the text read is not what the mirror holds
    monkeypatch.setattr(mirror.ledger, "reread", real)
    await mirror.resync()
    assert mirror.nodes == await truth(led)


async def test_a_booking_applied_while_a_full_read_is_under_way_does_not_keep_what_no_write_explains(
        populated: Ledger, mirror: Mirror, monkeypatch: pytest.MonkeyPatch) -> None:
    """The mirror's n4 differs from the ledger under the same last write (a misapplied message; here forged),
    which only a full read can see. The extender books on n4 while that read is under way and applies its
    message here, onto the wrong snapshot: the later read must not be dropped for it, or the booking carries
    the ledger's (version, stamp) over the wrong content, which no periodic resync reads again, and the full
    read is undone for another FULL_EVERY resyncs (for good, if a booking falls in each one). The read is
    installed, and the booking's message, which the feed then brings, applies onto it."""
    led = populated
    await mirror.resync(full=True)
    mirror.put(dataclasses.replace(mirror.nodes["n4"], reservations={}))  # u1 and u2 missing here
    real = mirror.ledger.reread
    feeds: list[dict[str, object]] = []

    async def reread_then_book(nodes: list[str], previous: dict[str, int],
                  isolate: bool = False, apart: object = ()) -> Reread:
        out = await real(nodes, previous, isolate, apart)  # type: ignore[arg-type]
        assert {"u1", "u2"} <= set(out.snaps["n4"].reservations)  # the read has them
        outcome, _ = await led.reserve("n4", "u9", [1], 8, 2, 1, pod="ns/p9")
        assert outcome.ok and outcome.feed is not None
        assert mirror.apply(outcome.feed) is None  # the extender's _apply_feed: onto the wrong snapshot
        feeds.append(dict(outcome.feed))
        return out

    monkeypatch.setattr(mirror.ledger, "reread", reread_then_book)
    while (mirror.resyncs + 1) % FULL_EVERY:
        mirror.resyncs += 1  # the next resync reads every node
    await mirror.resync()
    monkeypatch.setattr(mirror.ledger, "reread", real)
    assert feeds and mirror.apply(feeds[0]) is None  # the feed's copy of the booking, after the resync
    assert mirror.nodes == await truth(led)
    assert {"u1", "u2", "u9"} <= set(mirror.nodes["n4"].reservations)


async def test_a_booking_applied_here_is_not_kept_over_a_read_of_keys_made_anew(
        populated: Ledger, mirror: Mirror, monkeypatch: pytest.MonkeyPatch) -> None:
    """The extender books on n5 and applies the message here as a resync reads, and then n5's keys are made anew
    (removed and added again, or Redis flushed and rebuilt: versions count from 1 again) before the read gets to
    it. The booking's version is higher than the new keys', but it is of a history the ledger no longer has:
    the read is installed, not the booking the ledger lost."""
    led = populated
    await mirror.resync(full=True)
    real = mirror.ledger.reread

    async def book_remake_then_read(nodes: list[str], previous: dict[str, int],
                  isolate: bool = False, apart: object = ()) -> Reread:
        outcome, _ = await led.reserve("n5", "u9", [1], 8, 2, 1, pod="ns/p9")
        assert outcome.ok and outcome.feed is not None
        assert mirror.apply(outcome.feed) is None  # the extender's _apply_feed
        assert await led.remove_node("n5")
        await led.upsert_node(inventory("n5", S5000))  # version 1 again, nothing booked
        return await real(nodes, previous, isolate, apart)  # type: ignore[arg-type]

    monkeypatch.setattr(mirror.ledger, "reread", book_remake_then_read)
    monkeypatch.setattr(mirror_module, "FULL_EVERY", 1)  # every resync reads every node
    await mirror.resync()
    assert mirror.nodes == await truth(led) and not mirror.nodes["n5"].reservations


async def test_a_booking_applied_during_a_full_read_of_a_current_node_is_kept(
        populated: Ledger, mirror: Mirror, monkeypatch: pytest.MonkeyPatch) -> None:
    """The common case, without any lost message: every 10th resync reads every node, also those the mirror
    holds as they are. n5 changed since the last read (a booking the feed brought, so the text last read no
    longer describes it and the reply is decoded); the extender books on it after its read and applies the
    script's reply at once (the next write of what the mirror holds): the read, one write older, does not
    undo the booking."""
    led = populated
    await mirror.resync(full=True)
    first, _ = await led.reserve("n5", "u1", [1], 8, 2, 1, pod="ns/p1")
    assert first.ok and first.feed is not None and mirror.apply(first.feed) is None  # as the feed applies it
    real = mirror.ledger.reread

    async def reread_then_book(nodes: list[str], previous: dict[str, int],
                  isolate: bool = False, apart: object = ()) -> Reread:
        out = await real(nodes, previous, isolate, apart)  # type: ignore[arg-type]
        outcome, _ = await led.reserve("n5", "u2", [1], 8, 2, 1, pod="ns/p2")  # the bind, after the read
        assert outcome.ok and outcome.feed is not None
        assert mirror.apply(outcome.feed) is None and "u2" in mirror.nodes["n5"].reservations
        return out

    monkeypatch.setattr(mirror.ledger, "reread", reread_then_book)
    monkeypatch.setattr(mirror_module, "FULL_EVERY", 1)  # every resync reads every node
    await mirror.resync()
    assert {"u1", "u2"} <= set(mirror.nodes["n5"].reservations)
    monkeypatch.setattr(mirror.ledger, "reread", real)
    await mirror.resync()
    assert mirror.nodes == await truth(led)
