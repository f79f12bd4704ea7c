"""Ended pods' tombstones (shared/domain/ended.py, `<prefix>:{<node>}:ended`): a write read before a pod ended books
it no more once the pod watcher's release of it reached Redis first, even for a moment, and never over a pod that
took its room meanwhile. The watchers' "release again" after their write stays as a belt (an older release's
watcher leaves no tombstone); these tests look at the ledger right after the write, before that belt runs.

Real parts: redis-server, the product's Ledger, NodeWatcher, PodWatcher and Reconciler (wired as the watcher role
wires them); the interleavings are made deterministic by running the pod's deletion inside the write's read."""

from __future__ import annotations

from typing import Any

import pytest

from controller.reconciler import Reconciler
from shared.domain.annotations import PodUsage
from shared.domain.ended import ENDED_KEEP_MS, ENDED_TRIM_FLOOR, next_trim
from shared.store.ledger import Ledger, LedgerError
from tests.redis.helpers import S5000, all_violations, inventory
from tests.redis.test_redteam_inflight_nodes import CFG, NoKube, bound_pod, gpu_node, live_on

pytestmark = pytest.mark.redis

H = PodUsage("rt", (0,), 128, 12, 1)  # 64 GiB and 12 core groups on card 0 of an S5000 (160 units)


def capture_replace(ledger: Ledger, seen: list[tuple[dict[str, Any], Any]]) -> Any:
    """Ledger.replace_node, recording its answer and the node right after it (before any release that follows)."""
    real = ledger.replace_node

    async def replace_node(inv: Any, *args: Any, **kw: Any) -> Any:
        out = await real(inv, *args, **kw)
        seen.append((out, (await ledger.snapshots([inv.node])).get(inv.node)))
        return out

    ledger.replace_node = replace_node  # type: ignore[method-assign]
    return real


@pytest.mark.parametrize("node_event", ["DELETED", "MODIFIED"], ids=["node deleted", "capacity dropped to 0"])
async def test_the_node_watchers_write_does_not_book_a_holder_that_ended_meanwhile(ledger: Ledger,
                                                                                  node_event: str) -> None:
    nodes, pods = await live_on(ledger, "tw")
    pod = bound_pod("t1", "tw", 0, 64 * 1024, 12)
    await pods.on_event("ADDED", pod)
    assert "t1" in nodes.holders("tw")
    real_list = ledger.list_node

    async def pod_deleted_meanwhile(node: str) -> Any:
        await pods.on_event("DELETED", pod)  # the pod watcher's release (with its tombstone) reaches Redis first
        return await real_list(node)

    ledger.list_node = pod_deleted_meanwhile  # type: ignore[method-assign]
    seen: list[tuple[dict[str, Any], Any]] = []
    real = capture_replace(ledger, seen)
    gone = gpu_node("tw", units=0, cards=0) if node_event == "MODIFIED" else gpu_node("tw")
    await nodes.on_event(node_event, gone)
    ledger.list_node, ledger.replace_node = real_list, real  # type: ignore[method-assign]
    assert seen, "the node was not written with its holders"
    out, snap = seen[-1]
    assert out["ended"] == ["t1"], out
    assert snap is None or "t1" not in snap.reservations, f"the write booked the ended pod: {snap}"
    assert snap is None or all(c.mem_used == c.cores_used == c.slices == 0 for c in snap.cards.values()), snap


async def test_the_reconcilers_repair_does_not_book_a_holder_that_ended_meanwhile(ledger: Ledger) -> None:
    nodes, pods = await live_on(ledger, "tr", units=160)
    pod = bound_pod("t2", "tr", 0, 64 * 1024, 12)
    pods.learn("t2", pod)  # in the view, not in the ledger (its booking lost): the repair books it
    reconciler = Reconciler(NoKube(), ledger, CFG, nodes, pods)  # type: ignore[arg-type]
    real_list = ledger.list_node

    async def pod_deleted_and_room_taken_meanwhile(node: str) -> Any:
        await pods.on_event("DELETED", pod)  # the release: nothing booked, the uid tombstoned
        took = await ledger.reserve("tr", "other", [0], 128, 12, 1, pod="ns/other")
        assert took[0].ok, took
        return await real_list(node)

    ledger.list_node = pod_deleted_and_room_taken_meanwhile  # type: ignore[method-assign]
    seen: list[tuple[dict[str, Any], Any]] = []
    real = capture_replace(ledger, seen)
    await reconciler.reconcile_all()
    ledger.list_node, ledger.replace_node = real_list, real  # type: ignore[method-assign]
    assert seen, "the node was not repaired"
    out, snap = seen[-1]
    assert out["ended"] == ["t2"], out
    assert "t2" not in snap.reservations and "other" in snap.reservations, snap
    assert not all_violations({"tr": snap}), snap


async def test_a_rebuild_from_a_list_read_before_a_deletion_does_not_book_it(ledger: Ledger) -> None:
    """The reconciler's rebuild writes every node from one list: a pod deleted after it, released first, its room
    taken by another bind, is left out, and the card never holds more than it has."""
    await ledger.upsert_node(inventory("rt", S5000))
    assert (await ledger.observe("t3", H, "ns/t3"))["changed"]
    assert await ledger.release("rt", "t3", ended=True)  # the pod watcher's release of the deleted pod
    assert (await ledger.reserve("rt", "other", [0], 128, 12, 1, pod="ns/other"))[0].ok
    stats = await ledger.rebuild([inventory("rt", S5000)], {"t3": (H, "ns/t3")}, keep_ms=10_000)
    snap = (await ledger.snapshots(["rt"]))["rt"]
    assert "t3" not in snap.reservations and "other" in snap.reservations, (stats, snap)
    assert not all_violations({"rt": snap}), snap


async def test_the_observe_of_a_record_confirmed_after_its_pods_release_books_nothing(ledger: Ledger) -> None:
    await ledger.upsert_node(inventory("rt", S5000))
    assert (await ledger.reserve("rt", "t4", [0], 128, 12, 1, pod="ns/t4"))[0].ok
    assert await ledger.release("rt", "t4", ended=True)
    assert (await ledger.reserve("rt", "other", [0], 128, 12, 1, pod="ns/other"))[0].ok
    out = await ledger.observe("t4", H, "ns/t4", keep_bound=True)
    assert out.get("ended") and not out.get("changed") and not out.get("overcommit"), out
    snap = (await ledger.snapshots(["rt"]))["rt"]
    assert "t4" not in snap.reservations and not all_violations({"rt": snap}), snap


async def test_a_booking_freed_without_the_pod_ending_is_booked_by_its_record(ledger: Ledger) -> None:
    """Why not "observe only what is still booked": a booking the janitor expired (or Redis lost) under a Binding
    that was committed is booked by the record's observe. Only a pod's end tombstones it."""
    await ledger.upsert_node(inventory("rt", S5000))
    assert (await ledger.reserve("rt", "t5", [0], 128, 12, 1, pod="ns/t5"))[0].ok
    key = ledger.keys.res("rt", "t5")
    await ledger.redis.hset(key, "created", int(await ledger.redis.hget(key, "created")) - 600_000)  # type: ignore[misc]
    assert await ledger.expire("rt", 120, only=["t5"]) == ["t5"]  # the janitor's expiry (no tombstone)
    assert await ledger.release("rt", "t5") is False  # a give-back without `ended` tombstones nothing either
    out = await ledger.observe("t5", H, "ns/t5", keep_bound=True)
    assert out["changed"] and not out.get("ended"), out
    assert (await ledger.snapshots(["rt"]))["rt"].reservations["t5"].state == "bound"


async def test_replace_node_frees_a_booking_an_older_release_made_for_a_tombstoned_pod(ledger: Ledger) -> None:
    """An older release's observe (it knows no tombstones) booked the pod after its release: the next write of the
    node frees it, settling or not."""
    await ledger.upsert_node(inventory("rt", S5000))
    assert (await ledger.observe("t6", H, "ns/t6"))["changed"]  # bound just now: settling
    now = await ledger.redis_time_ms()
    await ledger.redis.hset(ledger.keys.ended("rt"), "t6", now)  # type: ignore[misc]
    out = await ledger.replace_node(inventory("rt", S5000), {}, keep_ms=60_000, keep_bound=True)
    snap = (await ledger.snapshots(["rt"]))["rt"]
    assert out["dropped"] == 1 and "t6" not in snap.reservations, (out, snap)
    assert all(c.mem_used == c.cores_used == c.slices == 0 for c in snap.cards.values()), snap


async def test_the_tombstones_stay_bounded_and_go_with_their_node(ledger: Ledger) -> None:
    key = ledger.keys.ended("rt")
    assert await ledger.release("rt", "t7", ended=True) is False  # a node Redis does not hold: no key left behind
    assert not await ledger.redis.exists(key)
    await ledger.upsert_node(inventory("rt", S5000))
    now = await ledger.redis_time_ms()
    # seeded, not written by a release: they count nothing toward the trim, which the written ones bring (the last
    # trim just now: not due by time, trim_due)
    await ledger.redis.hset(key, mapping={**{f"old{i}": now - ENDED_KEEP_MS - 60_000 for i in range(100)},  # type: ignore[misc]
                                          "recent": now - 60_000, "#trimmed": now})
    written = [f"t{i}" for i in range(ENDED_TRIM_FLOOR)]
    for uid in written:  # nothing held: tombstoned all the same
        assert await ledger.release("rt", uid, ended=True) is False
    fields = await ledger.redis.hgetall(key)  # type: ignore[misc]
    assert {f for f in fields if not f.startswith("#")} == {"recent", *written}, fields  # the old ones trimmed
    kept = len(written) + 1
    assert (int(fields["#n"]), int(fields["#trim_at"])) == (kept, next_trim(kept)), fields
    assert await ledger.release("rt", written[0], ended=True) is False  # tombstoned again: counted once
    assert int(await ledger.redis.hget(key, "#n")) == kept  # type: ignore[misc]
    assert await ledger.remove_node("rt") is True
    assert not await ledger.redis.exists(key)


async def test_a_binders_give_back_is_not_a_pods_end(ledger: Ledger) -> None:
    await ledger.upsert_node(inventory("rt", S5000))
    with pytest.raises(LedgerError, match="ended"):
        await ledger.give_back("rt", "t8", bind_no=1, attempt="0123456789abcdef", ended=True)


async def test_a_release_that_frees_nothing_still_answers_when_redis_is_full(ledger: Ledger,
                                                                            redis_client: Any) -> None:
    """A re-list releases every ended pod, most holding nothing: as before the tombstones, such a release is
    answered by a Redis that refuses writes (full, noeviction), its tombstone left out (the belts cover it)."""
    await ledger.upsert_node(inventory("rf", S5000))
    policy = (await redis_client.config_get("maxmemory-policy"))["maxmemory-policy"]
    await redis_client.config_set("maxmemory-policy", "noeviction")
    await redis_client.config_set("maxmemory", 1)
    try:
        assert await ledger.release("rf", "t9", ended=True) is False
    finally:
        await redis_client.config_set("maxmemory", 0)
        await redis_client.config_set("maxmemory-policy", policy)
    assert await ledger.redis.hget(ledger.keys.ended("rf"), "t9") is None  # type: ignore[misc]
    assert await ledger.release("rf", "t9", ended=True) is False  # room again: tombstoned
    assert await ledger.redis.hget(ledger.keys.ended("rf"), "t9") is not None  # type: ignore[misc]
