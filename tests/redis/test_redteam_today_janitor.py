"""Red team (today's changes): the janitor's two-clock rule (`pending_since`) dated a pending booking by its pod's
uid alone. A pod whose first booking its binder left behind (the binder died, or its Binding's outcome was
unknown) and that kube-scheduler then placed on another node has two pending bookings under one uid: the new
one, whose Binding is in flight, inherited the janitor's date of the old one. When Redis's clock stepped forward
beyond the TTL (the fault the rule is for), both clocks said the new booking was past its TTL and the janitor
released the card its Binding was about to take: two pods over one card. Now each booking is dated on its own
(its node, uid and Redis stamp)."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from shared.store.ledger import Ledger
from tests.redis._janitor import clocked_janitor
from tests.redis.helpers import S4000
from tests.redis.test_redteam_clock_forward import STEP_MS, step_forward
from tests.redis.test_redteam_clock_step import HOLD_MS
from tests.redis.test_redteam_inflight_nodes import CFG

pytestmark = pytest.mark.redis


async def test_a_pods_new_booking_on_another_node_is_dated_on_its_own(
        ledger: Ledger, redis_client: Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    janitor, mirror, clock = await clocked_janitor(ledger, monkeypatch, CFG, "tj-a", "tj-b")
    # the first attempt booked p1 on tj-a; its binder died before the Binding: the booking stays pending
    first, _ = await ledger.reserve("tj-a", "p1", [0], S4000, 16, 1, pod="ns/p1", hold_ms=HOLD_MS)
    assert first.ok
    # Redis's clock steps forward by more than the TTL (simulated, as in test_redteam_clock_forward, by moving the
    # stamps back: the stamps a booking carries are its key to the janitor, so each is moved before it is seen)
    await step_forward(redis_client, ledger, "tj-a", "p1", STEP_MS)
    await mirror.resync(full=True)
    assert await janitor.sweep() == []  # seen: dated now on the janitor's clock
    clock[0] += CFG.pending_ttl_seconds - 5.0
    assert await janitor.sweep() == []
    # a later attempt places p1 on tj-b; its Binding is in flight (and Redis's clock still ahead)
    again, _ = await ledger.reserve("tj-b", "p1", [0], S4000, 16, 1, pod="ns/p1", hold_ms=HOLD_MS)
    assert again.ok
    await step_forward(redis_client, ledger, "tj-b", "p1", STEP_MS)
    await mirror.resync(full=True)
    clock[0] += 5.0  # the next sweep: the old booking is past the TTL on both clocks, the new one 5 s old here
    await janitor.sweep()
    snap = await ledger.snapshot("tj-b")
    assert snap is not None and "p1" in snap.reservations, (
        "the janitor released p1's booking on tj-b, whose Binding is in flight, on the date of its booking on tj-a")
    taken, _ = await ledger.reserve("tj-b", "p2", [0], S4000, 16, 1, pod="ns/p2", hold_ms=HOLD_MS)
    assert not taken.ok, "a second pod booked the card p1's Binding is about to take: two pods over one card"
    old = await ledger.snapshot("tj-a")
    assert old is not None and "p1" not in old.reservations  # the left-behind one ends as before
    # and the new one ends too, a TTL after the janitor first saw it, if its binder died as well
    clock[0] += CFG.pending_ttl_seconds
    assert await janitor.sweep() == ["p1"]


async def test_a_booking_a_later_bind_attempt_took_over_is_dated_from_that_attempt(
        ledger: Ledger, redis_client: Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same on one node: a later attempt of the pod takes over its pending booking (reserve's `existing`),
    stamping only its settle_by, which no feed message brings; the janitor dated the booking from the first."""
    janitor, mirror, clock = await clocked_janitor(ledger, monkeypatch, CFG, "tj-c")
    first, _ = await ledger.reserve("tj-c", "p1", [0], S4000, 16, 1, pod="ns/p1", hold_ms=HOLD_MS)
    assert first.ok
    await step_forward(redis_client, ledger, "tj-c", "p1", STEP_MS)  # (Redis's clock ahead, as above)
    await mirror.resync(full=True)
    assert await janitor.sweep() == []
    clock[0] += CFG.pending_ttl_seconds - 5.0
    assert await janitor.sweep() == []
    # the first attempt's outcome was unknown, so the booking stayed; a later attempt takes it over, its Binding
    # in flight (its settle_by moved back by the step as well: only settle_by, which the mirror does not learn)
    again, _ = await ledger.reserve("tj-c", "p1", [0], S4000, 16, 1, pod="ns/p1", hold_ms=HOLD_MS)
    assert again.ok and again.existing
    key = ledger.keys.res("tj-c", "p1")
    settle_by = int(await redis_client.hget(key, "settle_by"))  # type: ignore[misc]
    await redis_client.hset(key, "settle_by", settle_by - STEP_MS)  # type: ignore[misc]
    clock[0] += 5.0
    assert await janitor.sweep() == [], "the janitor released a booking whose later attempt's Binding is in flight"
    taken, _ = await ledger.reserve("tj-c", "p2", [0], S4000, 16, 1, pod="ns/p2", hold_ms=HOLD_MS)
    assert not taken.ok, "a second pod booked the card p1's Binding is about to take: two pods over one card"
    # its binder died too: it ends a TTL after the janitor first saw that attempt, and the mirror's copy, still the
    # first attempt's, does not hold it for ever
    for _ in range(3):
        clock[0] += CFG.pending_ttl_seconds / 2
        if await janitor.sweep() == ["p1"]:
            break
    else:
        raise AssertionError("the booking was never expired")
