"""Red team of the digest resync (038fef1), real Redis: what a resync announces when something goes wrong.

Before 038fef1 every resync announced every node, so a listener that missed a node (its callback, or another
listener's, raised in the middle of replace_all) was put right within one resync period. Now a resync
announces only nodes whose snapshot object changed: a node the mirror installed but never announced keeps
that very object at every later resync and is never announced again, so the extender's Ranking never
holds it and the top-k filter never offers it, until the node happens to change.

The trigger used: a card hash damaged in Redis (slice_limit 0 on every card of n4; the scripts read a
damaged field as 0 and keep working, "until the reconciler rewrites the node", _lib.lua num), whose fill
divides by zero in Ranking.changed. The mirrors here are never started (the loop's supervisor would run
resync again, as the second call does here)."""

from __future__ import annotations

import contextlib

import pytest
from redis.asyncio import Redis

from controller.ranking import Ranking
from deploy.local.redis import RedisServer
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis.helpers import S4000, S5000, inventory


@pytest.mark.redis
async def test_a_listener_failing_mid_resync_does_not_hide_the_other_nodes_for_good(
        populated: Ledger, mirror: Mirror) -> None:
    led = populated
    for idx in (0, 1):  # every card of n4 damaged by hand: its fill is 0/0
        await led.redis.hset(led.keys.card("n4", idx), "slice_limit", "0")  # type: ignore[misc]
    ranking = Ranking(mirror)  # the extender makes its ranking before the mirror's first read
    for _ in range(2):  # the mirror's first read, then the supervisor's restart of it (a full re-read)
        with contextlib.suppress(ZeroDivisionError):  # Ranking.changed on n4 (pre-existing, not the point)
            await mirror.resync(full=True)
    await led.upsert_node(inventory("n4", S4000))  # the reconciler rewrites n4 from the API's truth
    await mirror.resync()
    await mirror.resync()
    assert mirror.nodes == await led.snapshots(await led.nodes())
    # every node the mirror holds is ranked (the filter's candidates come only from the ranking)
    assert set(ranking._fill) == set(mirror.nodes)
    assert all(ranking._fill[n] == s.fill for n, s in mirror.nodes.items())


async def _drain(pubsub: object) -> list[str]:
    out = []
    while (msg := await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.01)) is not None:  # type: ignore[attr-defined]
        if msg.get("type") == "message":
            out.append(msg["data"])
    return out


@pytest.mark.redis
@pytest.mark.parametrize("seed", range(8))
async def test_random_changes_lost_messages_and_local_applies_mid_resync_converge_in_one_quiet_resync(
        seed: int, populated: Ledger, mirror: Mirror, redis_server: RedisServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Random bookings, releases, binds, rewrites, removals and new nodes; a random share of the feed lost,
    the rest applied as the loop would (a gap re-reads the node); bookings made between two nodes' reads of
    a resync, their feed message applied at once as the extender does. Then the feed goes quiet: after one
    resync the mirror equals the ledger, and the ranking and the derived views agree with it."""
    import random

    import shared.store.ledger_reads as ledger_mod
    from shared.domain.node import mismatch_kind

    rng = random.Random(seed)
    led = populated
    monkeypatch.setattr(ledger_mod, "SNAPSHOT_BATCH", 1)  # a round trip per node: bookings fall between them
    sub = Redis.from_url(redis_server.url, decode_responses=True)
    pubsub = sub.pubsub()
    await pubsub.subscribe(led.feed)
    ranking = Ranking(mirror)
    await mirror.resync(full=True)
    names = ["n4", "n5", "nx", "nerr", "n6", "n7"]
    uids: dict[str, set[str]] = {n: set() for n in names}
    counter = 0

    async def op(local: bool) -> None:
        nonlocal counter
        n = rng.choice(names)
        r = rng.random()
        feed = None
        if r < 0.45:
            counter += 1
            uid = f"u{seed}-{counter}"
            out, _ = await led.reserve(n, uid, [rng.randint(0, 1)], rng.choice((1, 2, 8)), 1, 1, pod=f"ns/{uid}")
            if out.ok:
                uids[n].add(uid)
                feed = out.feed
        elif r < 0.65 and uids[n]:
            uid = rng.choice(sorted(uids[n]))
            _, feed = await led.release_feed(n, uid)
            uids[n].discard(uid)
        elif r < 0.75 and uids[n]:
            await led.mark_bound(n, rng.choice(sorted(uids[n])))
        elif r < 0.85:
            await led.upsert_node(inventory(n, rng.choice((S4000, S5000)), rng.choice((1, 2, 3)),
                                            unhealthy=rng.choice(((), (1,)))))
        elif r < 0.92 and not uids[n]:
            await led.remove_node(n)
        elif r < 0.94:  # Redis flushed under the mirror (no reconnect: no full re-read), nodes written anew
            await led.redis.flushall()
            for m in names:
                uids[m].clear()
                if rng.random() < 0.7:
                    await led.upsert_node(inventory(m, S4000))
        else:
            err = rng.choice(("", "sgpu-core capacity 17 is not a multiple of 16"))
            await led.upsert_node(inventory(n, S4000, error=err))
        if local and feed is not None:
            mirror.apply(feed)  # the extender's _apply_feed: a gap is left to the feed

    async def deliver() -> None:
        for raw in await _drain(pubsub):
            if rng.random() < 0.3:
                continue  # lost
            stale = mirror._handle(raw)
            if stale:
                await mirror._refetch(stale)

    real = Ledger._snapshot_batch

    async def batch(self: Ledger, nodes: list[str], previous: object, out: object, isolate: bool = False) -> None:
        if rng.random() < 0.4:
            await op(local=True)
        await real(self, nodes, previous, out, isolate)  # type: ignore[arg-type]

    monkeypatch.setattr(Ledger, "_snapshot_batch", batch)
    try:
        for _ in range(40):
            for _ in range(rng.randint(0, 4)):
                await op(local=rng.random() < 0.5)
            await deliver()
            if rng.random() < 0.5:
                await mirror.resync()
        monkeypatch.setattr(Ledger, "_snapshot_batch", real)
        await deliver()  # the feed goes quiet
        await mirror.resync()
        truth = await led.snapshots(await led.nodes())
        assert mirror.nodes == truth, seed
        assert ranking._fill == {n: s.fill for n, s in mirror.nodes.items()}, seed
        for p, keys in ranking._order.items():
            assert len(keys) == len(mirror.nodes), (seed, p)
        caps, mism = mirror._views()
        assert caps == frozenset(c for s in truth.values() if not s.error for c in s.capacities), seed
        assert dict(mism) == {n: s.error for n, s in truth.items() if mismatch_kind(s.error)}, seed
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]
        await sub.aclose()
