"""Red team of the (version, stamp) resync (real Redis).

A periodic resync skips a node whose (version, stamp) equals the mirror's snapshot's. That holds only if a
snapshot carrying the ledger's (version, stamp) also has the ledger's content. Mirror.apply merges a partial
message into the snapshot it holds and takes the message's stamp, whatever write that snapshot came from, so
a message of the *new* history applied onto a base of an *old* one gives a snapshot with the ledger's head
and content the ledger does not have: no periodic resync reads it, only the FULL_EVERY-th (300 s, not 30 s).

Both ways to get there are a lost feed message or a lost write, the case the periodic resync is there for:
- a node removed and created again while its `removed` message was lost (the new v1 `node` message is then
  taken as "already have it", and v2 applies onto the old node's cards);
- a shard that failed over to a lagging replica (Cluster: the subscriber is on another node, so it does not
  reconnect and no full read follows): the mirror applied the write the old master lost, the new master's
  write with that version is taken as "already have it", and the next one applies onto the lost write.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis

from deploy.local.redis import RedisServer
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis.helpers import S4000, inventory, periodic, truth

pytestmark = pytest.mark.redis


class Feed:
    """The feed's messages, captured by a subscriber of our own (the mirror under test is never started)."""

    def __init__(self, client: Redis, channel: str):
        self.pubsub = client.pubsub()
        self.channel = channel

    async def __aenter__(self) -> Feed:
        await self.pubsub.subscribe(self.channel)
        while (m := await self.pubsub.get_message(timeout=1.0)) is None or m.get("type") != "subscribe":
            pass  # subscribed before anything is published
        return self

    async def __aexit__(self, *_: Any) -> None:
        await self.pubsub.aclose()  # type: ignore[no-untyped-call]

    async def drain(self) -> list[dict[str, Any]]:
        out = []
        while True:
            msg = await self.pubsub.get_message(ignore_subscribe_messages=True, timeout=0.3)
            if msg is None:
                return out
            if msg.get("type") == "message":
                out.append(orjson.loads(msg["data"]))


async def node_keys(client: Redis, node: str) -> list[str]:
    return [k async for k in client.scan_iter(match=f"mt:{{{node}}}:*")]


async def test_a_node_created_anew_while_its_removed_message_was_lost_is_read_by_the_next_resync(
        ledger: Ledger, mirror: Mirror, redis_client: Redis) -> None:
    led = ledger
    await led.upsert_node(inventory("n4", S4000, 2))
    await mirror.resync(full=True)
    assert set(mirror.nodes["n4"].cards) == {0, 1}
    async with Feed(redis_client, led.feed) as feed:
        await led.remove_node("n4")
        await led.upsert_node(inventory("n4", S4000, 1))  # created anew: one card, version 1
        assert (await led.reserve("n4", "u9", [0], 8, 2, 1, pod="ns/p9"))[0].ok  # version 2
        msgs = await feed.drain()
    assert [m["kind"] for m in msgs] == ["removed", "node", "reserve"]
    for m in msgs[1:]:  # the `removed` message is lost
        stale = mirror.apply(m)
        if stale:
            await mirror._refetch(stale)
    periodic(mirror)
    await mirror.resync()  # the periodic resync is what heals a lost message
    assert mirror.nodes == await truth(led), "the old node's card 1 survives a periodic resync"


async def test_a_write_lost_by_a_failover_is_not_kept_under_the_new_masters_writes(
        ledger: Ledger, mirror: Mirror, redis_client: Redis, redis_server: RedisServer) -> None:
    led = ledger
    await led.upsert_node(inventory("n4", S4000, 2))
    await mirror.resync(full=True)
    raw = Redis.from_url(redis_server.url)  # bytes: DUMP/RESTORE
    # what the lagging replica holds: the node before the write the old master acknowledged, then lost
    keys = await node_keys(redis_client, "n4")
    saved = {k: await raw.dump(k) for k in keys}
    async with Feed(redis_client, led.feed) as feed:
        assert (await led.reserve("n4", "ulost", [1], 16, 4, 1, pod="ns/lost"))[0].ok  # version 2, lost
        lost = await feed.drain()
        assert mirror.apply(lost[0]) is None  # the mirror got it from the old master
        assert "ulost" in mirror.nodes["n4"].reservations
        # the failover: the promoted replica never had it
        try:
            for k in await node_keys(redis_client, "n4"):
                if k not in saved:
                    await redis_client.delete(k)
            for k, v in saved.items():
                await raw.restore(k, 0, v, replace=True)
        finally:
            await raw.aclose()
        assert "ulost" not in (await led.snapshot("n4")).reservations  # type: ignore[union-attr]
        led._known.pop("n4", None)
        # the new master's writes: version 2 again (the mirror "already has it"), then 3 (applied onto ulost)
        assert (await led.reserve("n4", "u2", [0], 8, 2, 1, pod="ns/p2"))[0].ok
        assert (await led.reserve("n4", "u3", [0], 8, 2, 1, pod="ns/p3"))[0].ok
        msgs = await feed.drain()
    for m in msgs:
        stale = mirror.apply(m)
        if stale:
            await mirror._refetch(stale)
    periodic(mirror)
    await mirror.resync()
    assert mirror.nodes == await truth(led), "the lost write's reservation survives a periodic resync"


async def test_a_damaged_version_field_does_not_stop_every_resync(populated: Ledger, mirror: Mirror,
                                                                  redis_client: Redis) -> None:
    """A node hash edited by hand (version not a number) is one node the scripts read as version 0; Ledger.heads
    must not raise on it, or every periodic resync of every mirror fails (and with it the mirror's loop)."""
    led = populated
    await mirror.resync(full=True)
    await redis_client.hset(led.node_key("nx"), "version", "garbage")  # type: ignore[misc]
    periodic(mirror)
    await asyncio.wait_for(mirror.resync(), 10)
    assert mirror.nodes == await truth(led)
