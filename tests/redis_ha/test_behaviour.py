"""The ledger's behaviour on Redis Sentinel and on Redis Cluster: a subset of the tests of
tests/redis, run unchanged on clients made by `shared.store.ledger.connect` (see conftest.py), and what is
particular to the two topologies (URLs, AUTH, keys spread over shards).

On Cluster the two-node fixtures spread over all three shards (n5 on the first, n4 and nx on the
second, nerr on the third; test_fixture_nodes_spread_over_shards says so), so the pipelined
`snapshots` and `rebuild` cross shards, and SCRIPT LOAD / SCRIPT FLUSH / FLUSHALL reach every primary.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

import pytest
from redis import exceptions as rexc
from redis.asyncio.sentinel import MasterNotFoundError

from deploy.local.redis import ClusterSetup, SentinelSetup
from shared.store.ledger import Ledger, connect, connect_subscriber
from shared.store.mirror import Mirror
from tests.redis import (
    test_in_flight_bookings,
    test_mark_bound_batch,
    test_mirror,
    test_redteam_inflight_nodes,
    test_script_keys,
    test_scripts_behaviour,
    test_scripts_input,
)
from tests.redis.conftest import MirrorFactory
from tests.redis.helpers import S4000, eventually, inventory
from tests.redis_ha.conftest import PASSWORD, settle_feed

pytestmark = pytest.mark.redis_ha

Case = Callable[..., Awaitable[None]]
b, i, m, f = test_scripts_behaviour, test_scripts_input, test_mirror, test_in_flight_bookings

ON_TWO_NODES: list[Case] = [
    b.test_reserve_twice_returns_the_same_cards_and_books_once, b.test_release_twice,
    b.test_mark_bound_twice_and_unknown, b.test_observe_confirms_a_pending_reservation_without_double_booking,
    b.test_observe_replaces_a_different_booking_and_reports_overcommit,
    b.test_observe_on_unknown_cards_keeps_the_usage_visible, b.test_expire_releases_only_old_pending_reservations,
    b.test_removed_card_stays_while_held, b.test_node_error_keeps_usage_and_refuses_bookings,
    b.test_rebuild_keeps_pending_that_over_fill_and_says_so, b.test_rebuild_after_flush_and_intact,
    b.test_script_flush_reloads_transparently, b.test_place_refits_after_a_conflict,
    b.test_place_exclusive_and_multi_book_whole_cards,
    # the node watcher on its own nodes: remove_node with a payload, replace_node keeping what settles
    f.test_remove_node_leaves_a_node_where_a_booking_settles,
    f.test_a_just_bound_booking_not_yet_seen_survives_deletion,
    # a batch of confirmations: its uids' keys share the node's slot
    test_mark_bound_batch.test_a_batch_is_bounded_and_checked_whole_before_anything_changes,
]
ON_POPULATED: list[Case] = [
    b.test_snapshot_reads_exactly_the_keys, b.test_remove_node_forgets_everything_of_that_node_only,
    b.test_rebuild_sets_exactly_what_the_api_implies, b.test_place_on_unknown_or_broken_node,
    i.test_unknown_node_is_refused_and_nothing_is_created, i.test_populated_fixture_is_consistent,
    test_redteam_inflight_nodes.test_remove_node_with_keep_ms_declares_every_key_and_spares_what_settles,
]
MIRROR_ON_TWO_NODES: list[Case] = [m.test_mirror_applies_the_feed_in_order, m.test_mirror_refetches_a_node_after_a_gap,
                                   test_mark_bound_batch.test_a_mirror_applies_every_reservation_of_a_batch]
MIRROR_ON_POPULATED: list[Case] = [m.test_mirror_refetches_after_a_rebuild_and_drops_removed_nodes,
                                   m.test_mirror_capacities_and_owner_of]


def name(case: Any) -> str:
    return str(case.__name__).removeprefix("test_")


@pytest.mark.parametrize("case", ON_TWO_NODES, ids=name)
async def test_on_two_nodes(case: Case, cluster: Ledger) -> None:
    await case(cluster)


async def test_every_script_declares_every_key_it_touches(redis_client: Any) -> None:
    """On Cluster the keys of the scenario's nodes live on different shards (n4, n5)."""
    await test_script_keys.test_every_script_declares_every_key_it_touches(test_script_keys.StrictLedger(redis_client))


@pytest.mark.parametrize("case", ON_POPULATED, ids=name)
async def test_on_populated(case: Case, populated: Ledger) -> None:
    await case(populated)


@pytest.mark.parametrize("case", MIRROR_ON_TWO_NODES, ids=name)
async def test_mirror_on_two_nodes(case: Case, cluster: Ledger, mirror_factory: MirrorFactory, ha_url: str) -> None:
    if case is m.test_mirror_applies_the_feed_in_order and ha_url.startswith("redis+cluster:"):
        # It also checks the order of changes across nodes; on Cluster the feed is ordered per node
        # only (each node's shard publishes its own messages), which is all the mirror relies on.
        pytest.skip("order across nodes is not kept on Cluster: test_cluster_feed_is_ordered_per_node")
    await case(cluster, mirror_factory)


async def test_cluster_feed_is_ordered_per_node(cluster_setup: ClusterSetup) -> None:
    led = Ledger(connect(cluster_setup.url))
    sub = connect_subscriber(cluster_setup.url)
    mirror = Mirror(led, subscriber=sub)
    try:
        await led.redis.flushall()
        for n in ("n4", "n5", "nerr"):  # three shards
            await led.upsert_node(inventory(n, S4000))
        await settle_feed(cluster_setup.url, led.redis)  # type: ignore[arg-type]
        await mirror.start()
        await asyncio.wait_for(mirror.ready.wait(), 10)
        changed: list[str] = []
        mirror.on_change.append(changed.append)
        for k in range(3):
            for n in ("n4", "n5", "nerr"):
                assert (await led.reserve(n, f"{n}-{k}", [k % 2], 2, 1, 1))[0].ok
        await eventually(lambda: len(changed) == 9, what="nine changes applied")
        assert mirror.refetches == 0 and mirror.applied == 9  # each node's messages came in order
        assert mirror.nodes == await led.snapshots(["n4", "n5", "nerr"])
    finally:
        await mirror.stop()
        await sub.aclose()
        await led.redis.aclose()


@pytest.mark.parametrize("case", MIRROR_ON_POPULATED, ids=name)
async def test_mirror_on_populated(case: Case, populated: Ledger, mirror_factory: MirrorFactory) -> None:
    await case(populated, mirror_factory)


async def test_ledger_without_load_scripts(redis_client: Any) -> None:
    await b.test_ledger_without_load_scripts_works(redis_client)


async def test_fixture_nodes_spread_over_shards(cluster_setup: ClusterSetup) -> None:
    owners = {n: cluster_setup.owner_of(f"mt:{{{n}}}:node").port for n in ("n4", "n5", "nx", "nerr")}
    assert len(set(owners.values())) == 3, owners


async def refused(url: str) -> Exception:
    client = connect(url)
    try:
        with pytest.raises(Exception) as e:  # checked by the caller (RedisClusterException is no RedisError)
            await client.ping()
        return e.value
    finally:
        await client.aclose()


async def test_a_wrong_password_is_refused(sentinel_setup: SentinelSetup, cluster_setup: ClusterSetup) -> None:
    right = quote(PASSWORD, safe="")
    # Sentinel, wrong for the sentinels too: no sentinel answers, so no master is found (and it says why).
    e = await refused(sentinel_setup.url.replace(right, "wrong"))
    assert isinstance(e, MasterNotFoundError) and "AuthenticationError" in str(e)
    # Right for the sentinels, wrong for the data nodes.
    e = await refused(sentinel_setup.url.replace(right, "wrong") + f"?sentinel_password={right}")
    assert isinstance(e, rexc.AuthenticationError)
    e = await refused(cluster_setup.url.replace(right, "wrong"))
    assert isinstance(e.__cause__, rexc.AuthenticationError)


async def test_sentinels_without_a_password() -> None:
    """Data nodes with a password, sentinels without one: `?sentinel_password=` (empty) says so."""
    setup = SentinelSetup(password=PASSWORD, sentinel_auth=False).start()
    client = connect(setup.url)
    sub = connect_subscriber(setup.url)
    try:
        assert setup.url.endswith("?sentinel_password=")
        led = Ledger(client)
        assert await led.upsert_node(inventory("n4", S4000)) == 1
        mirror = Mirror(led, subscriber=sub)
        await mirror.start()
        await asyncio.wait_for(mirror.ready.wait(), 10)
        assert (await led.reserve("n4", "u1", [0], 8, 1, 1))[0].ok
        await eventually(lambda: "u1" in mirror.nodes["n4"].reservations, what="the mirror sees u1")
        await mirror.stop()
    finally:
        await client.aclose()
        await sub.aclose()
        setup.cleanup()


@pytest.mark.parametrize("url", ["redis+sentinel://127.0.0.1:26379", "redis+sentinel://127.0.0.1:26379/",
                                 "redis+cluster://", "redis+sentinel://:pw@/mymaster"])
def test_incomplete_urls_are_refused(url: str) -> None:
    with pytest.raises(ValueError):
        connect(url)
