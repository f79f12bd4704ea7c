"""Red team: a ledger key of another type than docs/redis-layout.md gives it (a string or list where a hash or set
belongs: an operator's `SET` on the wrong name, another program sharing the prefix). Nothing a script writes, yet
every script that declared it failed WRONGTYPE, a plain ResponseError the supervisor counts as a bug:

1. a node's hash, card, reservation, pods set or tombstones: every snapshot of the node failed, and a pipelined read
   fails whole, so the mirror's resync (every replica) and the reconciler's pass (the one repairer) failed for
   ever, five times in a row and each role gave up, into the same after its restart (a crash loop), and no booking
   or release on the node went through;
2. `<prefix>:nodes`: every read of the node list failed (the mirrors, the reconciler's pass), as did listing a node.

Now a script deletes a declared key of another type before it reads anything, and answers DAMAGED naming it; the
caller calls again, and the node reads as if the key were missing, which the watchers repair as any missing key
(a missing node hash is a node lost: rebuilt). A node list of another type is deleted and read as empty; the
reconciler's pass lists every node it reads again.

Real parts: redis-server, the product's Ledger, Mirror, NodeWatcher, PodWatcher and Reconciler; the API client is
a stand-in no call here may reach."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from redis.asyncio import Redis

from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis.helpers import S4000, inventory, violations
from tests.redis.test_reconcile_touched import setup
from tests.redis.test_redis_62 import ledger62  # noqa: F401  (a fixture: Redis 6.2)

pytestmark = pytest.mark.redis

Damage = Callable[[Redis, Ledger], Awaitable[object]]


def wrong(kind: str, key: Callable[[Ledger], str]) -> Damage:
    async def damage(redis: Redis, ledger: Ledger) -> object:
        name = key(ledger)
        await redis.delete(name)
        if kind == "string":
            return await redis.set(name, "oops")
        return await redis.rpush(name, "oops")  # type: ignore[misc]
    return damage


DAMAGES: dict[str, Damage] = {
    "node hash as a string": wrong("string", lambda led: led.keys.node("ta")),
    "card hash as a list": wrong("list", lambda led: led.keys.card("ta", 0)),
    "reservation hash as a string": wrong("string", lambda led: led.keys.res("ta", "u1")),
    "pods set as a string": wrong("string", lambda led: led.keys.pods("ta")),
    "tombstones as a list": wrong("list", lambda led: led.keys.ended("ta")),
}


async def types(redis: Redis, ledger: Ledger, node: str) -> dict[str, str]:
    keys = [ledger.keys.node(node), ledger.keys.pods(node), ledger.keys.ended(node), ledger.keys.card(node, 0),
            ledger.keys.card(node, 1)]
    return {k: await redis.type(k) for k in keys}  # type: ignore[misc]


@pytest.mark.parametrize("what", list(DAMAGES))
async def test_a_key_of_another_type_is_cleared_and_repaired(ledger: Ledger, redis_client: Redis, what: str) -> None:
    rec, _pods = await setup(ledger)  # nodes ta and tb, 2 S4000 cards each, listed
    assert (await ledger.reserve("ta", "u1", [0], 8, 2, 1, pod="ns/p1"))[0].ok
    await DAMAGES[what](redis_client, ledger)
    # every read of the node, alone and with others, answers (before: WRONGTYPE, the whole read failed)
    snaps = await ledger.snapshots(["ta", "tb"])
    assert "tb" in snaps
    mirror = Mirror(Ledger(redis_client))
    await mirror.resync(full=True)  # a replica's resync, from the node list down
    assert "tb" in mirror.nodes
    # the pass repairs the node from the watchers' view (a node hash lost: the node is written anew); the tombstones
    # (which no read declares) are cleared by the first write that declares them, the pod watcher's release of a pod
    # that ended here
    if what.startswith("tombstones"):
        assert await ledger.release("ta", "u1", ended=True)
        assert await redis_client.hexists(ledger.keys.ended("ta"), "u1")  # type: ignore[misc]
    else:
        assert await rec.reconcile_all()
    found = await types(redis_client, ledger, "ta")
    assert found == {ledger.keys.node("ta"): "hash", ledger.keys.pods("ta"): found[ledger.keys.pods("ta")],
                     ledger.keys.ended("ta"): "hash", ledger.keys.card("ta", 0): "hash",
                     ledger.keys.card("ta", 1): "hash"}
    assert found[ledger.keys.pods("ta")] in ("set", "none")  # (none: no booking left on the node)
    snap = (await ledger.snapshots(["ta"]))["ta"]
    assert [c.capacity for c in snap.cards.values()] == [S4000, S4000]
    assert violations(snap) == []
    # and it books again, within the card's room (a node hash lost: once the keep window verifies it again, as any
    # node Redis lost, since a booking in flight may have been lost with it: docs/redis-layout.md "Losing Redis")
    booked = (await ledger.reserve("ta", "u2", [1], 8, 2, 1, pod="ns/p2"))[0]
    assert booked.ok or (what.startswith("node hash") and booked.refused.startswith("node unverified")), booked


async def test_a_booking_on_a_damaged_card_is_refused_not_failed(ledger: Ledger, redis_client: Redis) -> None:
    """The extender's booking met the damage first: a refusal it can plan around, not an error, and nothing
    over-committed (the card's usage is unknown until the watchers write the node again: no booking on it)."""
    await setup(ledger)
    assert (await ledger.reserve("ta", "u1", [0], S4000, 16, 1, pod="ns/p1"))[0].ok  # card 0 full
    await wrong("list", lambda led: led.keys.card("ta", 0))(redis_client, ledger)
    result = (await ledger.reserve("ta", "u2", [0], 8, 2, 1, pod="ns/p2"))[0]
    assert not result.ok, result


async def test_a_node_list_of_another_type_is_read_as_empty_and_listed_again(ledger: Ledger,
                                                                           redis_client: Redis) -> None:
    rec, _pods = await setup(ledger)
    await redis_client.delete(ledger.keys.nodes)
    await redis_client.set(ledger.keys.nodes, "oops")
    assert await ledger.nodes() == []  # before: WRONGTYPE, every mirror's resync and every pass failed
    await rec.reconcile_all()
    assert await ledger.nodes() == ["ta", "tb"]
    await redis_client.delete(ledger.keys.nodes)
    await redis_client.hset(ledger.keys.nodes, "a", "b")  # type: ignore[misc]
    assert await ledger.list_node("ta") == 1
    assert await ledger.nodes() == ["ta"]


async def test_a_node_hash_of_another_type_names_no_write_in_the_heads(ledger: Ledger, redis_client: Redis) -> None:
    """A mirror's periodic resync reads every node's (version, stamp) in one pipeline first (Ledger.heads): one node
    hash of another type failed it whole, for every node, before any snapshot could clear the key."""
    await setup(ledger)
    await wrong("string", lambda led: led.keys.node("ta"))(redis_client, ledger)
    heads = await ledger.heads(["ta", "tb"])
    assert heads["ta"] == (-1, "") and heads["tb"][0] > 0  # ta names no write: read again (and so cleared)
    mirror = Mirror(Ledger(redis_client))
    await mirror.resync(full=True)
    await mirror.resync()
    assert "tb" in mirror.nodes and await redis_client.type(ledger.keys.node("ta")) == "none"


async def test_a_key_of_another_type_is_cleared_on_redis_6_2(ledger62: Ledger) -> None:  # noqa: F811
    """The probe (redis.pcall's error, WRONGTYPE) reads the same on the oldest Redis docs/install.md names."""
    led = ledger62
    await led.upsert_node(inventory("n4", S4000))
    await led.list_node("n4")
    await led.redis.delete(led.keys.card("n4", 0))
    await led.redis.set(led.keys.card("n4", 0), "oops")
    snap = (await led.snapshots(["n4"]))["n4"]
    assert sorted(snap.cards) == [1]  # card 0 read as missing (the watchers write it again)
    assert await led.redis.type(led.keys.card("n4", 0)) == "none"
