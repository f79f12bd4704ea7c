"""Red team, clocks (left open last session): Redis's clock steps *forward* by more than pendingTTLSeconds (an NTP
step, a failover to a server whose clock is ahead) while a bind's Binding is in flight. Every booking ages by the
step on Redis's clock at once: `expires` saw the in-flight booking past its TTL and its `settle_by` passed, and
the janitor released it; the card went to the next pod and the Binding then committed the first one on it, two
pods over one card. Simulated by moving the booking's stamps back by the step (what a step forward does to them);
the scripts read the real TIME. Now the janitor dates each pending booking on its own monotonic clock too
(`pending_since`): it is expired only once both clocks say it is past the TTL."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from controller.janitor import Janitor
from shared.domain.reconcile import pending_since
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis._janitor import clocked_janitor
from tests.redis.helpers import S4000, inventory
from tests.redis.test_redteam_clock_step import HOLD_MS
from tests.redis.test_redteam_inflight_nodes import CFG, KEEP_MS

pytestmark = pytest.mark.redis

STEP_MS = 10 * 60_000  # Redis's clock steps forward 10 minutes (pendingTTLSeconds is 120)


async def step_forward(redis: Redis, ledger: Ledger, node: str, uid: str, ms: int) -> None:
    key = ledger.keys.res(node, uid)
    created, settle_by = await redis.hmget(key, ["created", "settle_by"])  # type: ignore[misc]
    await redis.hset(key, mapping={"created": int(created) - ms, "settle_by": int(settle_by) - ms})  # type: ignore[misc]


async def test_the_janitor_keeps_a_booking_in_flight_when_redis_clock_steps_forward(
        ledger: Ledger, redis_client: Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    janitor, mirror, clock = await clocked_janitor(ledger, monkeypatch, CFG, "cf1")
    out, _ = await ledger.reserve("cf1", "p1", [0], S4000, 16, 1, pod="ns/p1", hold_ms=HOLD_MS)
    assert out.ok
    await step_forward(redis_client, ledger, "cf1", "p1", STEP_MS)
    await mirror.resync(full=True)
    clock[0] += 5.0  # its next sweep, 5 s later on this host
    assert await janitor.sweep() == [], "the janitor expired a booking whose Binding is in flight"
    taken, _ = await ledger.reserve("cf1", "p2", [0], S4000, 16, 1, pod="ns/p2", hold_ms=HOLD_MS)
    assert not taken.ok, "a second pod booked the card p1's Binding is about to take: two pods over one card"
    # its binder died: it still ends, a TTL after the janitor first saw it
    clock[0] += CFG.pending_ttl_seconds
    assert await janitor.sweep() == ["p1"]


@pytest.mark.parametrize(("ages", "before", "first", "want"), [
    ({"a": 200_000}, {}, True, {"a": 800.0}),  # first sweep: dated by Redis's clock, nothing else to go by
    ({"a": 200_000}, {}, False, {"a": 1000.0}),  # a booking new to a running janitor: now, whatever its stamp says
    ({"a": 200_000}, {"a": 900.0}, False, {"a": 900.0}),  # seen before: kept
    ({"a": -5_000}, {}, True, {"a": 1000.0}),  # stamped ahead (restamps): not dated in the future
    ({}, {"gone": 10.0}, False, {}),  # no longer pending: forgotten
])
def test_pending_since(ages: dict[str, int], before: dict[str, float], first: bool, want: dict[str, float]) -> None:
    assert pending_since(ages, before, 1000.0, first) == want


async def test_a_repair_keeps_a_booking_in_flight_when_redis_clock_steps_forward(
        ledger: Ledger, redis_client: Redis) -> None:
    """The reconciler writes the node from a view that lacks the pod (not bound yet): the booking stays."""
    await ledger.upsert_node(inventory("cf2", S4000, n=1))
    out, _ = await ledger.reserve("cf2", "p1", [0], S4000, 16, 1, pod="ns/p1", hold_ms=HOLD_MS)
    assert out.ok
    await step_forward(redis_client, ledger, "cf2", "p1", STEP_MS)
    now = await ledger.redis_time_ms()
    await ledger.replace_node(inventory("cf2", S4000, n=1), {}, KEEP_MS, keep_bound=True, keep_from=now - KEEP_MS)
    snap = await ledger.snapshot("cf2")
    assert snap is not None and "p1" in snap.reservations, "the repair dropped the booking in flight"


async def test_a_janitor_sweeping_before_its_mirror_is_read_dates_the_bookings_by_redis(
        ledger: Ledger, redis_client: Redis) -> None:
    """At a watcher's start the janitor may sweep before its mirror's first whole read: the bookings that read
    brings are dated by Redis's clock, not made to wait a TTL from then."""
    await ledger.upsert_node(inventory("cf3", S4000, n=1))
    out, _ = await ledger.reserve("cf3", "p1", [0], S4000, 16, 1, pod="ns/p1", hold_ms=HOLD_MS)
    assert out.ok
    await step_forward(redis_client, ledger, "cf3", "p1", STEP_MS)  # (its binder died long ago)
    mirror = Mirror(ledger)
    janitor = Janitor(ledger, mirror, CFG)
    assert await janitor.sweep() == []  # nothing read yet
    await mirror.resync(full=True)
    assert await janitor.sweep() == ["p1"]
