"""The webhook's mirror (`shapes_only`): bookings are not decoded, what the webhook reads is always current.

The webhook reads two things of its mirror: the capacities of the cluster's cards and the nodes whose cards
are mismatched. A booking and its confirmation (`reserve`, `bound`: most of the feed in a burst) change
neither, so such a mirror moves the node's (version, stamp) and decodes nothing. Checked against a full
mirror on the same feed, on a real redis-server: every step leaves both with the same views and the same
(version, stamp) per node, gaps are still re-read, and a full resync makes the snapshots equal again.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from shared.domain.annotations import PodUsage
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis.helpers import S4000, S5000, eventually, inventory

pytestmark = pytest.mark.redis


@pytest.fixture
async def pair(cluster: Ledger) -> AsyncIterator[tuple[Ledger, Mirror, Mirror]]:
    full, shapes = Mirror(cluster), Mirror(cluster, shapes_only=True)
    for m in (full, shapes):
        await m.start()
        await asyncio.wait_for(m.ready.wait(), 5)
    yield cluster, full, shapes
    for m in (full, shapes):
        await m.stop()


def heads(m: Mirror) -> dict[str, tuple[int, str]]:
    return {n: (s.version, s.stamp) for n, s in m.nodes.items()}


async def same_views(full: Mirror, shapes: Mirror, what: str) -> None:
    """Both mirrors caught up with the ledger's heads: then their views and heads agree."""
    led = full.ledger

    async def caught_up() -> bool:
        want = await led.heads(list(await led.nodes()))
        return heads(full) == want and heads(shapes) == want

    await eventually(caught_up, what=f"both mirrors at the ledger's heads after {what}")
    assert shapes.capacities() == full.capacities(), what
    assert dict(shapes.mismatched()) == dict(full.mismatched()), what


async def test_views_and_heads_agree_with_a_full_mirror_at_every_step(pair: tuple[Ledger, Mirror, Mirror]) -> None:
    led, full, shapes = pair
    decoded = dict(shapes.nodes)
    assert (await led.reserve("n4", "u1", [0], 8, 2, 1, pod="ns/u1"))[0].ok
    await same_views(full, shapes, "a reserve")
    assert await led.mark_bound("n4", "u1")
    await same_views(full, shapes, "its confirmation")
    # not decoded: the shapes mirror's n4 still holds what it read, under the new head
    assert "u1" not in shapes.nodes["n4"].reservations and "u1" in full.nodes["n4"].reservations
    assert shapes.nodes["n4"].cards == decoded["n4"].cards
    assert (await led.reserve("n5", "u2", [1], S5000, 16, 1, model=S5000, whole=True, pod="ns/u2"))[0].ok
    await same_views(full, shapes, "a whole card")
    assert await led.release("n4", "u1")
    await same_views(full, shapes, "a release")  # applied whole
    assert "u1" not in full.nodes["n4"].reservations
    assert (await led.observe("u3", PodUsage("n4", (5,), 4, 1, 1), "ns/u3"))["ok"]  # a removed placeholder card
    await same_views(full, shapes, "an observe on an unknown card")
    assert shapes.nodes["n4"].cards.keys() == full.nodes["n4"].cards.keys()
    await led.upsert_node(inventory("n6", S5000))
    await same_views(full, shapes, "a new node")
    assert S5000 in shapes.capacities()
    await led.upsert_node(inventory("n4", S4000, error="sgpu-core capacity 17 is not a multiple of 16"))
    await same_views(full, shapes, "a node in error")
    assert shapes.nodes["n4"].error == full.nodes["n4"].error != ""
    await led.remove_node("n6")
    await same_views(full, shapes, "a removed node")
    assert "n6" not in shapes.nodes
    # a full resync reads every node: the snapshots are the ledger's again
    await shapes.resync(full=True)
    await full.resync(full=True)
    assert shapes.nodes == full.nodes


async def test_a_gap_is_still_read_again(pair: tuple[Ledger, Mirror, Mirror]) -> None:
    _, _, shapes = pair
    cur = shapes.nodes["n4"]
    msg = {"node": "n4", "version": cur.version + 2, "kind": "reserve", "full": False, "uid": "ux",
           "res": {"cards": "0", "mem": 1, "cores": 1, "slices": 1, "state": "pending"}, "cards": {}}
    assert shapes.apply(msg) == "n4"
    msg = {**msg, "version": cur.version + 1, "prev": "another-history", "stamp": "s"}
    if cur.stamp:
        assert shapes.apply(msg) == "n4"  # another history: not taken either
    assert shapes.nodes["n4"] is cur


async def test_the_webhook_role_asks_for_it() -> None:
    """webhook/runner.py starts its mirror in this mode; the extender's and the watcher's decode everything."""
    import inspect

    import controller.roles
    import webhook.runner

    assert "shapes_only=True" in inspect.getsource(webhook.runner.run_webhook)
    assert "shapes_only" not in inspect.getsource(controller.roles)
