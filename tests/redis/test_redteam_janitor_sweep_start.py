"""Red team: the janitor dates a booking after its sweep's first Redis round trip, not at the sweep's start, so a
slow round trip at the sweep that first sees it costs a whole interval past the documented bound.

shared/domain/timing.py pending_release_bound_s: the janitor "dates a booking when a sweep first sees it" and
"expires it at the first sweep that starts at least pendingTTLSeconds after that", so the TTL ends on a sweep's
start and the bound is interval + ceil(TTL / interval) x interval + sweep. The sweep read its own clock after asking
Redis for its time: a round trip of r seconds at the sighting dated the booking r late, and the sweep that starts
exactly TTL later (TTL a multiple of the interval, as the default 120 s of 5 s) found it r short and left it to the
next, an interval later. A booking made just after the sweep before it looked (~ an interval before the sighting)
was then released interval + TTL + interval + sweep after it was made: past the bound by almost an interval (5 s).

Expected: the sweep that starts TTL after the one that first saw the booking expires it, whatever that sighting's
round trip to Redis took.

Real parts: redis-server, Ledger, Mirror, Janitor; the janitor's monotonic clock is the test's (it moves only when
the test says so), Redis's clock is real.
"""

from __future__ import annotations

import types

import pytest

import controller.janitor as janitor_module
from controller.janitor import Janitor
from shared.config import Config
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis.helpers import S4000, eventually, inventory

pytestmark = pytest.mark.redis


async def test_redteam_the_sweep_a_ttl_after_the_sighting_expires_the_booking(
        ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]  # the janitor's monotonic clock
    monkeypatch.setattr(janitor_module, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    await ledger.upsert_node(inventory("w1", S4000, n=1))
    mirror = Mirror(ledger)
    await mirror.resync(full=True)
    janitor = Janitor(ledger, mirror, Config(pending_ttl_seconds=10))
    janitor.ttl = 1
    assert await janitor.sweep() == []  # the sweep before: nothing booked yet
    assert (await ledger.reserve("w1", "u1", [0], 8, 2, 1))[0].ok
    await mirror.resync(full=True)
    made = await ledger.redis_time_ms()

    round_trip = [0.2]
    redis_time_ms = ledger.redis_time_ms

    async def slow_redis_time() -> int:
        clock[0] += round_trip[0]  # the sweep's first round trip to Redis takes this long on the janitor's clock
        return await redis_time_ms()

    monkeypatch.setattr(ledger, "redis_time_ms", slow_redis_time)
    clock[0] = 1000.0 + janitor.interval  # the sweep that first sees it starts an interval after the one before
    sighted = clock[0]
    assert await janitor.sweep() == []  # younger than the TTL: dated, not expired

    async def past_ttl() -> bool:
        return await redis_time_ms() - made > 1000

    await eventually(past_ttl, what="the booking past its TTL on Redis's clock")
    round_trip[0] = 0.0
    clock[0] = sighted + janitor.ttl  # the first sweep that starts a TTL after the sighting's start
    gone = await janitor.sweep()
    assert gone == ["u1"], (
        "the sweep that started pendingTTLSeconds after the one that first saw the booking left it (dated after that "
        "sweep's round trip to Redis, not at its start): released an interval past pending_release_bound_s")
