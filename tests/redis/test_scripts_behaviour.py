"""What each ledger script does with good input, on a real Redis: idempotency by uid, capacity
changes, expiry, removal, rebuild, script reloading after SCRIPT FLUSH, and Ledger.place."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from deploy.local.redis import RedisServer
from shared.config import Config
from shared.domain.annotations import PodUsage
from shared.domain.fit import FitResult
from shared.domain.models import CardModel
from shared.domain.request import pod_request
from shared.domain.state import NodeSnapshot
from shared.store.ledger import Ledger
from shared.store.placing import place
from tests.redis.helpers import (
    S4000,
    S5000,
    actual_usage,
    dump,
    exclusive_pod,
    expected_usage,
    inventory,
    multi_pod,
    slice_pod,
    violations,
)

CFG = Config(memory_per_card=(CardModel(S4000), CardModel(S5000)))


async def snap(led: Ledger, node: str) -> NodeSnapshot:
    s = await led.snapshot(node)
    assert s is not None
    return s


async def node_keys(led: Ledger, node: str) -> list[str]:
    return sorted([k async for k in led.redis.scan_iter(match=f"mt:{{{node}}}:*")])


# -- idempotency by uid ---------------------------------------------------------------------------

@pytest.mark.redis
async def test_reserve_twice_returns_the_same_cards_and_books_once(cluster: Ledger) -> None:
    led = cluster
    first, _ = await led.reserve("n4", "u1", [1], 8, 2, 1)
    assert first.ok and first.cards == (1,) and not first.existing
    before = await dump(led.redis)
    again, _ = await led.reserve("n4", "u1", [0], 8, 2, 1)  # other cards, the same amounts: the same answer
    assert again.ok and again.cards == (1,) and again.existing
    assert await dump(led.redis) == before  # nothing booked, no version bump
    # other amounts: refused (a pod's request does not change; its record would not be what is booked)
    other, _ = await led.reserve("n4", "u1", [0], 32, 8, 2)
    assert not other.ok and other.refused.startswith("booked with other amounts"), other
    assert await dump(led.redis) == before
    s = await snap(led, "n4")
    assert (s.cards[1].mem_used, s.cards[1].cores_used, s.cards[1].slices) == (8, 2, 1)
    assert s.cards[0].mem_used == 0 and violations(s) == []


@pytest.mark.redis
async def test_release_twice(cluster: Ledger) -> None:
    led = cluster
    assert (await led.reserve("n4", "u1", [0, 1], 96, 16, 1, model=S4000, whole=True))[0].ok
    assert await led.release("n4", "u1") is True
    after_first = await dump(led.redis)
    assert await led.release("n4", "u1") is False
    assert await dump(led.redis) == after_first
    s = await snap(led, "n4")
    assert all(c.mem_used == 0 and c.mem_free == S4000 and c.cores_free == 16 and c.slices == 0
               for c in s.cards.values())
    assert s.reservations == {}
    assert "mt:{n4}:res:u1" not in after_first and "mt:{n4}:pods" not in after_first  # nothing left behind


@pytest.mark.redis
async def test_mark_bound_twice_and_unknown(cluster: Ledger) -> None:
    led = cluster
    assert (await led.reserve("n4", "u1", [0], 8, 1, 1))[0].ok
    assert await led.mark_bound("n4", "u1") is True
    v = (await snap(led, "n4")).version
    bound_at = (await snap(led, "n4")).reservations["u1"].bound_at
    assert await led.mark_bound("n4", "u1") is True
    s = await snap(led, "n4")
    assert s.version == v and s.reservations["u1"].bound_at == bound_at
    assert s.reservations["u1"].state == "bound"
    before = await dump(led.redis)
    assert await led.mark_bound("n4", "nobody") is False
    assert await dump(led.redis) == before


@pytest.mark.redis
async def test_observe_twice_books_once(cluster: Ledger) -> None:
    led = cluster
    usage = PodUsage("n5", (0, 1), S5000, 16, 1)
    out = await led.observe("u7", usage, "ns/multi")
    assert out["ok"] and out["changed"] and not out["overcommit"]
    before = await dump(led.redis)
    out = await led.observe("u7", usage, "ns/multi")
    assert out["ok"] and not out["changed"]
    assert await dump(led.redis) == before
    s = await snap(led, "n5")
    assert s.reservations["u7"].state == "bound" and s.reservations["u7"].pod == "ns/multi"
    assert [c.mem_used for c in s.cards.values()] == [S5000, S5000] and violations(s) == []


@pytest.mark.redis
async def test_observe_confirms_a_pending_reservation_without_double_booking(cluster: Ledger) -> None:
    led = cluster
    assert (await led.reserve("n4", "u1", [1], 8, 2, 1, pod="ns/p1"))[0].ok
    out = await led.observe("u1", PodUsage("n4", (1,), 8, 2, 1))  # pod "" keeps the recorded name
    assert out == {"ok": True, "changed": True, "overcommit": False}
    s = await snap(led, "n4")
    assert s.reservations["u1"].state == "bound" and s.reservations["u1"].pod == "ns/p1"
    assert s.cards[1].mem_used == 8 and violations(s) == []


@pytest.mark.redis
async def test_observe_replaces_a_different_booking_and_reports_overcommit(cluster: Ledger) -> None:
    led = cluster
    assert (await led.reserve("n4", "u1", [0], 8, 2, 1))[0].ok
    assert (await led.reserve("n4", "u2", [1], 90, 2, 1))[0].ok
    # the API says u1 holds 16 units on card 1: moved, and card 1 is now over-committed (90 + 16 > 96)
    out = await led.observe("u1", PodUsage("n4", (1,), 16, 2, 1))
    assert out["ok"] and out["changed"] and out["overcommit"]
    s = await snap(led, "n4")
    assert s.cards[0].mem_used == 0
    assert s.cards[1].mem_used == 106 and s.cards[1].mem_free == 0  # the truth, never a negative free
    assert violations(s, allow_overcommit=True) == []
    assert not (await led.reserve("n4", "u3", [1], 2, 1, 1))[0].ok
    assert await led.release("n4", "u2")
    s = await snap(led, "n4")
    assert s.cards[1].mem_used == 16 and s.cards[1].mem_free == 80 and violations(s) == []


@pytest.mark.redis
async def test_observe_on_unknown_cards_keeps_the_usage_visible(cluster: Ledger) -> None:
    """A bound pod on a card the node no longer reports: booked on a placeholder marked removed."""
    led = cluster
    out = await led.observe("u1", PodUsage("n4", (5,), 8, 1, 1))
    assert out["ok"]
    s = await snap(led, "n4")
    assert s.cards[5].health == "removed" and s.cards[5].mem_used == 8
    assert [c.card.index for c in s.card_states()] == [0, 1]  # never offered
    assert violations(s) == []
    assert await led.release("n4", "u1")
    assert 5 not in (await snap(led, "n4")).cards


@pytest.mark.redis
async def test_expire_releases_only_old_pending_reservations(cluster: Ledger) -> None:
    led = cluster
    assert (await led.reserve("n4", "old-pending", [0], 8, 1, 1))[0].ok
    assert (await led.reserve("n4", "old-bound", [0], 8, 1, 1))[0].ok
    assert await led.mark_bound("n4", "old-bound")
    await asyncio.sleep(3.1)  # (a TTL of 3 s: new-pending stays younger through a stalled machine)
    assert (await led.reserve("n4", "new-pending", [1], 8, 1, 1))[0].ok
    # `only`: the janitor's vetted uids (controller/janitor.py Janitor.sweep); others wait
    assert await led.expire("n4", 3.0, only=["new-pending", "old-bound"]) == []
    assert await led.expire("n4", 3.0, only=[]) == []
    assert await led.expire("n4", 3.0, only=["old-pending"]) == ["old-pending"]
    assert await led.expire("n4", 3.0) == []
    s = await snap(led, "n4")
    assert sorted(s.reservations) == ["new-pending", "old-bound"]
    assert s.cards[0].mem_used == 8 and violations(s) == []


# -- capacity changes (upsert_node) ---------------------------------------------------------------

@pytest.mark.redis
async def test_reservations_survive_upsert(cluster: Ledger) -> None:
    led = cluster
    assert (await led.reserve("n4", "u1", [0], 8, 2, 1))[0].ok
    assert (await led.reserve("n4", "u2", [0, 1], 32, 4, 1))[0].ok
    before = await snap(led, "n4")
    v = await led.upsert_node(inventory("n4", S4000))  # same cards, e.g. a relist
    after = await snap(led, "n4")
    assert v == before.version + 1 == after.version
    assert after.reservations == before.reservations and after.cards == before.cards


@pytest.mark.redis
async def test_capacity_shrinks_below_usage(cluster: Ledger) -> None:
    led = cluster
    assert (await led.reserve("n4", "u1", [0], 64, 8, 1))[0].ok
    await led.upsert_node(inventory("n4", 32, slice_limit=1))  # smaller cards, one slice each
    s = await snap(led, "n4")
    c = s.cards[0]
    assert (c.capacity, c.mem_used, c.mem_free, c.slices, c.slice_limit) == (32, 64, 0, 1, 1)
    assert "u1" in s.reservations and violations(s, allow_overcommit=True) == []
    out, _ = await led.reserve("n4", "u2", [0], 2, 1, 1)
    assert not out.ok and out.reason == "CardTimeSlicingExhausted"
    assert await led.release("n4", "u1")
    s = await snap(led, "n4")
    assert (s.cards[0].mem_used, s.cards[0].mem_free, s.cards[0].cores_free) == (0, 32, 16)
    assert violations(s) == []


@pytest.mark.redis
async def test_removed_card_stays_while_held(cluster: Ledger) -> None:
    led = cluster
    assert (await led.reserve("n4", "u1", [0], 8, 2, 1))[0].ok
    await led.upsert_node(inventory("n4", S4000, indices=[1]))  # card 0 no longer reported
    s = await snap(led, "n4")
    assert s.cards[0].health == "removed" and s.cards[0].mem_used == 8 and "u1" in s.reservations
    assert [c.card.index for c in s.card_states()] == [1]
    out, _ = await led.reserve("n4", "u2", [0], 2, 1, 1)
    assert not out.ok and out.reason == "CardNotFound"
    assert violations(s) == []
    # reported again while still held: back in service with its usage
    await led.upsert_node(inventory("n4", S4000))
    s = await snap(led, "n4")
    assert s.cards[0].health == "ok" and s.cards[0].mem_used == 8
    # removed again, then released: the card disappears with its last holder
    await led.upsert_node(inventory("n4", S4000, indices=[1]))
    assert await led.release("n4", "u1")
    s = await snap(led, "n4")
    assert sorted(s.cards) == [1] and violations(s) == []
    assert await led.redis.hget(led.node_key("n4"), "cards") == "1"
    assert not await led.redis.exists("mt:{n4}:card:0")


@pytest.mark.redis
async def test_unheld_card_disappears_at_once(cluster: Ledger) -> None:
    led = cluster
    await led.upsert_node(inventory("n4", S4000, indices=[1]))
    assert sorted((await snap(led, "n4")).cards) == [1]
    assert not await led.redis.exists("mt:{n4}:card:0")


@pytest.mark.redis
async def test_node_error_keeps_usage_and_refuses_bookings(cluster: Ledger) -> None:
    led = cluster
    assert (await led.reserve("n5", "u1", [1], 16, 2, 1))[0].ok
    await led.upsert_node(inventory("n5", S5000, error="label mthreads.com/sgpu.cores lists 3 cards"))
    s = await snap(led, "n5")
    assert s.error and sorted(s.cards) == [1] and s.cards[1].health == "removed" and s.cards[1].mem_used == 16
    out, _ = await led.reserve("n5", "u2", [0], 2, 1, 1)
    assert not out.ok and out.reason.startswith("node unregistered: label")
    await led.upsert_node(inventory("n5", S5000))
    s = await snap(led, "n5")
    assert not s.error and s.cards[1].health == "ok" and s.cards[1].mem_used == 16 and violations(s) == []


@pytest.mark.redis
async def test_cordon_and_health_changes_keep_usage(cluster: Ledger) -> None:
    led = cluster
    assert (await led.reserve("n4", "u1", [0], 8, 2, 1))[0].ok
    await led.upsert_node(inventory("n4", S4000, cordoned=[0], unhealthy=[1]))
    s = await snap(led, "n4")
    assert (s.cards[0].health, s.cards[1].health, s.cards[0].mem_used) == ("cordoned", "unhealthy", 8)
    assert (await led.reserve("n4", "u2", [0], 2, 1, 1))[0].reason == "CardCordoned"
    assert (await led.reserve("n4", "u2", [1], 2, 1, 1))[0].reason == "CardNotHealth"


# -- snapshot, remove_node --------------------------------------------------------------------------

@pytest.mark.redis
async def test_snapshot_reads_exactly_the_keys(populated: Ledger) -> None:
    led = populated
    raw = await dump(led.redis)
    for node in ("n4", "n5", "nx", "nerr"):
        s = await snap(led, node)
        meta = raw[f"mt:{{{node}}}:node"][1]
        assert s.version == int(meta["version"]) and s.error == meta["error"]
        assert ",".join(str(i) for i in sorted(s.cards)) == meta["cards"]
        for i, c in s.cards.items():
            h = raw[f"mt:{{{node}}}:card:{i}"][1]
            assert h["id"] == f"{node}-mthreads-{i}"
            assert (c.capacity, c.mem_used, c.mem_free, c.cores, c.cores_used, c.cores_free, c.slices,
                    c.slice_limit, c.health) == (int(h["capacity"]), int(h["mem_used"]), int(h["mem_free"]),
                                                 int(h["cores"]), int(h["cores_used"]), int(h["cores_free"]),
                                                 int(h["slices"]), int(h["slice_limit"]), h["health"])
        pods = raw.get(f"mt:{{{node}}}:pods", ("set", []))[1]
        assert sorted(s.reservations) == pods
        for uid, r in s.reservations.items():
            h = raw[f"mt:{{{node}}}:res:{uid}"][1]
            assert (",".join(map(str, r.cards)), r.mem, r.cores, r.slices, r.state, r.pod) == \
                (h["cards"], int(h["mem"]), int(h["cores"]), int(h["slices"]), h["state"], h["pod"])
    want = {"n4": await snap(led, "n4"), "n5": await snap(led, "n5")}
    assert await led.snapshots(["n4", "ghost", "n5"]) == want


@pytest.mark.redis
async def test_remove_node_forgets_everything_of_that_node_only(populated: Ledger) -> None:
    led = populated
    others = {k: v for k, v in (await dump(led.redis)).items() if "{n4}" not in k and k != "mt:nodes"}
    assert await led.remove_node("n4") is True
    assert await node_keys(led, "n4") == []
    assert "n4" not in await led.nodes()
    assert {k: v for k, v in (await dump(led.redis)).items() if k != "mt:nodes"} == others
    assert await led.remove_node("n4") is False


# -- rebuild (replace_node) -------------------------------------------------------------------------

@pytest.mark.redis
async def test_rebuild_sets_exactly_what_the_api_implies(populated: Ledger) -> None:
    led = populated
    bound = {
        "b1": (PodUsage("n4", (0,), 8, 2, 1), "ns/b1"),
        "b2": (PodUsage("n4", (0, 1), 32, 8, 1), "ns/b2"),
        "b3": (PodUsage("n5", (1,), 128, 4, 2), "ns/b3"),
        # its node is not in the inventory (deleted, or capacity 0): the usage is kept on a placeholder
        # card, so a node re-created under its pods is never offered empty
        "lost": (PodUsage("gone-node", (0,), 8, 1, 1), "ns/lost"),
    }
    invs = [inventory("n4", S4000), inventory("n5", S5000)]
    stats = await led.rebuild(invs, bound, keep_ms=None)
    assert stats["nodes"] == 2 and stats["bound"] == 3 and stats["removed"] == 2  # nx and nerr
    # pending reservations not in the truth: u2 (n4 card 1, 16 units) still fits next to b2 -> kept;
    # u3 (exclusive 160 on n5 card 0) fits too. u1 was bound but is not in the truth -> dropped.
    snaps = await led.snapshots(await led.nodes())
    assert sorted(snaps) == ["gone-node", "n4", "n5"]
    gone = snaps.pop("gone-node")
    assert list(gone.reservations) == ["lost"] and gone.cards[0].health == "removed"
    assert gone.card_states() == []  # offers nothing
    assert sorted(snaps["n4"].reservations) == ["b1", "b2", "u2"]
    assert sorted(snaps["n5"].reservations) == ["b3", "u3"]
    assert stats["pending_kept"] == 2 and stats["pending_overfull"] == 0
    placements = [u for uid, (u, _p) in bound.items() if uid != "lost"]
    placements += [PodUsage("n4", (1,), 16, 4, 1), PodUsage("n5", (0,), S5000, 16, 1)]
    assert actual_usage(snaps) == expected_usage(placements)
    assert all(r.state == "bound" for uid, r in snaps["n4"].reservations.items() if uid.startswith("b"))
    assert all(not violations(s) for s in snaps.values())
    assert await led.intact()


@pytest.mark.redis
async def test_rebuild_keeps_pending_that_over_fill_and_says_so(cluster: Ledger) -> None:
    """A pending reservation that no longer fits next to the truth is kept: its binder writes the Binding
    and its record whatever the ledger says, so dropping it would offer a share about to be held. The card
    shows over-full, offers nothing more, and the rebuild counts it."""
    led = cluster
    assert (await led.reserve("n4", "p1", [0], 64, 4, 1))[0].ok
    bound = {"b1": (PodUsage("n4", (0,), 64, 4, 1), "ns/b1")}
    stats = await led.rebuild([inventory("n4", S4000), inventory("n5", S5000)], bound)
    assert stats["pending_kept"] == 1 and stats["pending_overfull"] == 1
    s = await snap(led, "n4")
    assert sorted(s.reservations) == ["b1", "p1"] and s.cards[0].mem_used == 128 and s.cards[0].mem_free == 0
    assert not (await led.reserve("n4", "p2", [0], 2, 1, 1))[0].ok  # nothing more on it
    assert (await led.reserve("n4", "p3", [1], 2, 1, 1))[0].ok  # the other card is untouched
    # the binder ends it (bind failed, or the TTL): the card is back to the truth
    assert await led.release("n4", "p1")
    assert (await snap(led, "n4")).cards[0].mem_used == 64


@pytest.mark.redis
async def test_rebuild_after_flush_and_intact(cluster: Ledger) -> None:
    led = cluster
    await led.rebuild([inventory("n4", S4000)], {})
    assert await led.intact()
    await led.redis.flushall()
    assert not await led.intact()
    bound = {"b1": (PodUsage("n4", (1,), 8, 1, 1), "")}
    await led.rebuild([inventory("n4", S4000)], bound)
    s = await snap(led, "n4")
    assert s.version == 1 and list(s.reservations) == ["b1"]
    assert actual_usage({"n4": s}) == {("n4", 1): (8, 1, 1)}


# -- scripts reload after SCRIPT FLUSH (NOSCRIPT) ------------------------------------------------------

@pytest.mark.redis
async def test_script_flush_reloads_transparently(cluster: Ledger) -> None:
    led = cluster
    await led.redis.script_flush()
    trips = led.round_trips
    out, _ = await led.reserve("n4", "u1", [0], 8, 1, 1)
    assert out.ok
    # one call: redis-py's script object got NOSCRIPT, loaded the script and sent it again
    assert led.round_trips == trips + 1
    assert await led.redis.script_exists(led._scripts["reserve"].sha) == [True]
    await led.redis.script_flush()
    assert sorted(await led.snapshots(["n4", "n5"])) == ["n4", "n5"]  # the pipelined read reloads too
    await led.redis.script_flush()
    assert await led.release("n4", "u1")


@pytest.mark.redis
async def test_ledger_without_load_scripts_works(redis_client: Redis) -> None:
    led = Ledger(redis_client)  # never called load_scripts: the first call loads them
    assert await led.upsert_node(inventory("n4", S4000)) == 1
    assert (await led.reserve("n4", "u1", [0], 8, 1, 1))[0].ok


@pytest.mark.redis
async def test_calls_survive_a_redis_restart(redis_server: RedisServer, redis_client: Redis) -> None:
    """After a restart every script is gone (and the data): the next call reloads and goes on."""
    led = Ledger(redis_client)
    await led.upsert_node(inventory("n4", S4000))
    await asyncio.to_thread(redis_server.restart)
    assert await led.snapshot("n4") is None
    assert await led.upsert_node(inventory("n4", S4000), create=False) == -1
    assert await led.upsert_node(inventory("n4", S4000)) == 1


# -- Ledger.place ---------------------------------------------------------------------------------------

@pytest.mark.redis
async def test_place_books_in_one_round_trip_with_a_current_snapshot(cluster: Ledger) -> None:
    led = cluster
    req = pod_request(slice_pod((8, 2), (4, 1)), CFG)
    assert req is not None
    trips = led.round_trips
    out, fit = await place(led, "n4", "u1", req, {}, await snap(led, "n4"), "spread")
    assert led.round_trips == trips + 2  # the snapshot read above, and the reserve
    assert out.ok and out.round_trips == 1 and out.attempts == 1
    assert fit is not None and fit.cards == out.cards
    s = await snap(led, "n4")
    r = s.reservations["u1"]
    assert (r.mem, r.cores, r.slices, r.state) == (12, 3, 2, "pending") and violations(s) == []


@pytest.mark.redis
async def test_place_exclusive_and_multi_book_whole_cards(cluster: Ledger) -> None:
    led = cluster
    ex = pod_request(exclusive_pod(), CFG)
    multi = pod_request(multi_pod(2, pin="S5000"), CFG)
    assert ex is not None and multi is not None
    out, _ = await place(led, "n4", "e1", ex, {}, None, "spread")
    assert out.ok and len(out.cards) == 1
    out, _ = await place(led, "n5", "m1", multi, {}, None, "spread")
    assert out.ok and out.cards == (0, 1)
    s4, s5 = await snap(led, "n4"), await snap(led, "n5")
    assert sum(1 for c in s4.cards.values() if c.mem_free == 0 and c.cores_free == 0 and c.slices == 1) == 1
    assert all(c.mem_free == 0 and c.cores_free == 0 for c in s5.cards.values())
    out, _ = await place(led, "n4", "m2", pod_request(multi_pod(2), CFG), {}, None, "spread")  # type: ignore[arg-type]
    assert not out.ok and "ExclusiveDeviceAllocateConflict" in out.reason
    out, _ = await place(led, "n4", "m3", pod_request(multi_pod(2, pin="S5000"), CFG), {}, None,  # type: ignore[arg-type]
                             "spread")
    assert not out.ok and "CardTypeMismatch" in out.reason
    assert violations(s4) == [] and violations(s5) == []


@pytest.mark.redis
async def test_place_refits_after_a_conflict(cluster: Ledger) -> None:
    led = cluster
    stale = await snap(led, "n4")
    req = pod_request(slice_pod((64, 4)), CFG)
    assert req is not None
    # the stale snapshot says both cards are empty; spread picks card 1 (ties: highest index) ...
    assert (await led.reserve("n4", "other", [1], 64, 4, 1))[0].ok  # ... which another replica just took
    out, fit = await place(led, "n4", "u1", req, {}, stale, "spread")
    assert out.ok and out.cards == (0,) and out.attempts == 2 and out.round_trips == 2
    assert fit is not None and fit.cards == (0,)
    out, fit = await place(led, "n4", "u2", req, {}, stale, "spread")  # refused, and the fresh state says why
    assert not out.ok and out.reason == "2/2 CardInsufficientMemory" and out.round_trips == 1


@pytest.mark.redis
async def test_place_twice_returns_the_first_booking(cluster: Ledger) -> None:
    led = cluster
    req = pod_request(slice_pod((8, 1)), CFG)
    assert req is not None
    first, _ = await place(led, "n4", "u1", req, {}, None, "binpack")
    assert first.ok and first.cards == (1,)  # empty cards tie: the highest index, as HAMi
    before = await dump(led.redis)
    for snapshot in (None, await snap(led, "n4")):
        again, fit = await place(led, "n4", "u1", req, {}, snapshot, "spread")
        assert again.ok and again.existing and again.cards == first.cards
        assert fit == FitResult(first.cards)
    # a stale snapshot that does not know u1 yet (card 1 a little used, so spread picks card 0): the
    # script answers with u1's booking, and the returned fit says so too
    cards = {str(i): {"capacity": S4000, "mem_used": 2 * i, "mem_free": S4000 - 2 * i, "cores": 16,
                      "cores_used": i, "cores_free": 16 - i, "slices": i, "slice_limit": 16, "health": "ok"}
             for i in (0, 1)}
    stale = NodeSnapshot.from_json({"node": "n4", "version": 1, "error": "", "exists": True, "res": {},
                                    "cards": cards})
    again, fit = await place(led, "n4", "u1", req, {}, stale, "spread")
    assert again.ok and again.existing and again.cards == first.cards and fit == FitResult(first.cards)
    assert await dump(led.redis) == before


@pytest.mark.redis
async def test_place_retry_of_a_booking_on_a_removed_card(cluster: Ledger) -> None:
    """The retried pod's card left the node and the rest is full: still its own booking, no crash."""
    led = cluster
    assert (await led.reserve("n4", "u1", [0], 8, 1, 1))[0].ok
    await led.upsert_node(inventory("n4", S4000, indices=[1]))
    assert (await led.reserve("n4", "full", [1], S4000, 16, 1, whole=True))[0].ok
    req = pod_request(slice_pod((8, 1)), CFG)
    assert req is not None
    out, fit = await place(led, "n4", "u1", req, {}, await snap(led, "n4"), "spread")
    assert out.ok and out.existing and out.cards == (0,) and fit == FitResult((0,))


@pytest.mark.redis
async def test_place_on_unknown_or_broken_node(populated: Ledger) -> None:
    led = populated
    req = pod_request(slice_pod((8, 1)), CFG)
    assert req is not None
    out, _ = await place(led, "ghost", "u9", req, {}, None, "spread")
    assert not out.ok and out.reason == "node unregistered"
    out, _ = await place(led, "nerr", "u9", req, {}, None, "spread")
    assert not out.ok and out.reason.startswith("node unregistered: ")
    out, fit = await place(led, "nx", "u9", req, {}, None, "spread")
    assert not out.ok and fit is not None
    assert out.reason == "1/3 CardCordoned, 1/3 CardNotHealth, 1/3 CardTimeSlicingExhausted"
