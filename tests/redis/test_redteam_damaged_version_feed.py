"""Red team: a node `version` a hand edit damaged starts its count again (`counted`, `bump` in _lib.lua), and the
mirrors must read the node again rather than take the restarted versions for messages they already have.

A count that starts again at 0 made the next write's version its `span`: 1 for most writes (a mirror holding a higher
version reads a 1 as the keys made anew), but `n` for a batched confirmation of n binds (mark_bound). A mirror
holding a higher version took that message for one it already had (`version <= cur.version`: dropped before the stamp
is looked at), and every later write too until the count passed the mirror's version: the snapshot stayed stale (a
booking or release unseen) until a periodic resync. Now a restarted count is 1 after any write: the mirror reads the
node again at once (its `recreated` or `history` rule).

Real parts: redis-server, the product's Ledger and Mirror (its feed handling, `Mirror.apply`).
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis

from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests._wait import eventually
from tests.redis.test_reconcile_touched import setup

pytestmark = pytest.mark.redis


@pytest.mark.parametrize("value", ["abc", "-3", "99999999999999999999999", None])
async def test_a_batched_write_after_a_damaged_version_makes_the_mirror_read_the_node(
        ledger: Ledger, redis_client: Redis, value: str | None) -> None:
    """`value` None: the field deleted."""
    await setup(ledger)
    for i in range(4):  # the node's version well past 2
        assert (await ledger.reserve("ta", f"u{i}", [i % 2], 8, 2, 1, pod=f"ns/p{i}"))[0].ok
    mirror = Mirror(Ledger(redis_client))
    await mirror.resync(full=True)
    held = mirror.nodes["ta"].version
    assert held > 3
    sub = redis_client.pubsub()
    await sub.subscribe(ledger.feed)
    got: list[dict[str, Any]] = []

    async def listen() -> None:
        async for m in sub.listen():
            if m["type"] == "message":
                got.append(orjson.loads(m["data"]))

    task = asyncio.create_task(listen())
    try:
        if value is None:
            await redis_client.hdel(ledger.keys.node("ta"), "version")  # type: ignore[misc]
        else:
            await redis_client.hset(ledger.keys.node("ta"), "version", value)  # type: ignore[misc]
        assert await ledger.mark_bound_many("ta", ["u0", "u1", "u2"]) == []  # one message, span 3
        await eventually(lambda: len(got) == 1, what="the confirmation's feed message")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await sub.aclose()
    msg = got[0]
    assert mirror.apply(msg) == "ta", (
        f"version {msg['version']} (span {msg.get('span')}) after a damaged count: the mirror at {held} took it for a "
        "message it already had, its snapshot stale (three binds unconfirmed in it)")
