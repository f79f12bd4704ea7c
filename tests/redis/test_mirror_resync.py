"""A mirror's periodic resync decodes only what changed (real Redis): a node whose snapshot reply is the text
last read for it, and which nothing changed locally since, keeps its snapshot object (no decode, no
listener call); anything else is decoded, so a change the feed never delivered is still picked up.

The mirrors here are never started: their feed is never applied, as if every message were lost, so only
the resync can bring them up to date."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from deploy.local.redis import RedisServer
from shared.store.ledger import Ledger, Reread
from shared.store.mirror import Mirror


@pytest.fixture
async def mirror(redis_server: RedisServer) -> AsyncIterator[Mirror]:
    client = Redis.from_url(redis_server.url, decode_responses=True)
    m = Mirror(Ledger(client))
    await m.ledger.load_scripts()
    yield m
    await client.aclose()


async def truth(led: Ledger) -> dict[str, object]:
    return dict(await led.snapshots(await led.nodes()))


@pytest.mark.redis
async def test_a_resync_decodes_only_the_nodes_whose_reply_changed(populated: Ledger, mirror: Mirror) -> None:
    led = populated
    await mirror.resync(full=True)
    assert mirror.nodes == await truth(led) and mirror.decoded == 4  # n4, n5, nx, nerr
    before = dict(mirror.nodes)
    told: list[str] = []
    mirror.on_change.append(told.append)

    await mirror.resync()
    assert mirror.decoded == 4 and told == []  # nothing changed: nothing decoded, nobody told
    assert all(mirror.nodes[n] is before[n] for n in before)  # the same objects: derived memos stay valid

    assert (await led.reserve("n5", "u9", [1], 8, 2, 1, pod="ns/p9"))[0].ok  # its feed message is lost here
    await mirror.resync()
    assert mirror.nodes == await truth(led)
    assert mirror.decoded == 5 and told == ["n5"]  # only n5 read anew
    assert "u9" in mirror.nodes["n5"].reservations
    assert all(mirror.nodes[n] is before[n] for n in before if n != "n5")

    await mirror.resync(full=True)  # after a lost connection: every reply decoded
    assert mirror.decoded == 9 and mirror.nodes == await truth(led)


@pytest.mark.redis
async def test_a_node_changed_here_is_decoded_at_the_next_resync(populated: Ledger, mirror: Mirror) -> None:
    """A change applied to the mirror itself (the extender applies its own booking's feed message at once)
    voids the node's digest: the next resync decodes it, so a local snapshot that differs from the ledger
    (here a forged one) is replaced by the ledger's, however often the ledger's reply stays the same."""
    led = populated
    await mirror.resync(full=True)
    forged = dataclasses.replace(mirror.nodes["n4"], reservations={})
    mirror.put(forged)
    await mirror.resync()
    assert mirror.nodes == await truth(led) and set(mirror.nodes["n4"].reservations) == {"u1", "u2"}
    assert mirror.decoded == 5
    await mirror.resync()
    assert mirror.decoded == 5  # n4 as read now: not decoded again


@pytest.mark.redis
async def test_a_change_here_while_reading_keeps_the_newer_snapshot_and_no_digest(
        populated: Ledger, mirror: Mirror, monkeypatch: pytest.MonkeyPatch) -> None:
    """The resync awaits Redis many times, and the extender's bind may apply a feed message meanwhile: a node
    whose reply was the text last read keeps that newer local snapshot (it is not older than the read), and
    its digest is dropped, since the digest no longer describes it."""
    led = populated
    await mirror.resync(full=True)
    newer = dataclasses.replace(mirror.nodes["n5"], version=mirror.nodes["n5"].version + 1)
    real = mirror.ledger.reread

    async def reread_then_apply(nodes: list[str], previous: dict[str, int]) -> Reread:
        out = await real(nodes, previous)
        assert "n5" in out.unchanged
        mirror.put(newer)  # as a bind applying its booking's message between the read and the install
        return out

    monkeypatch.setattr(mirror.ledger, "reread", reread_then_apply)
    await mirror.resync()
    assert mirror.nodes["n5"] is newer
    monkeypatch.setattr(mirror.ledger, "reread", real)
    await mirror.resync()  # n5 decoded again (no digest): the ledger's own value comes back
    assert mirror.nodes == await truth(led) and mirror.decoded == 5
