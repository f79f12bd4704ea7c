"""The documented bound on a leaked reservation: a booking whose binder died before its Binding (a replica killed
mid-bind) is released by the janitor "after `pendingTTLSeconds`", and at the latest one sweep later (the janitor sweeps
every 5 s: `Janitor.interval`), never before the TTL (docs/runbooks.md, "A replica crashed mid-bind"; docs/
architecture.md, "No leaks"). Measured on the janitor's own loop (`Janitor.run`) over a started mirror that follows
the feed, as the watcher runs them, with the pod view live (the janitor's other condition, tested in
tests/redis/test_redteam_janitor_blind.py).

One booking is made every 0.5 s across a whole sweep cycle, each held for its Binding as the extender's is
(`hold_ms`: its deadline plus the settle time), so one of them meets the worst phase of the sweeps; each must be
released no sooner than the TTL and no later than the TTL plus a sweep (and the sweep's own time), counted from its
booking. Before, the documents gave the TTL alone as when it is released.

Real parts: redis-server, the product's Ledger, Mirror and Janitor."""

from __future__ import annotations

import asyncio
import time

import pytest

from controller.janitor import Janitor
from shared.config import load_config
from shared.domain.timing import BIND_SETTLE_S, bind_deadline_s
from shared.serving.supervise import cancel_and_wait
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis.helpers import S4000, inventory

pytestmark = pytest.mark.redis

TTL = 5  # pendingTTLSeconds' least value: the test's length is the TTL plus the sweeps
CFG = load_config(env={}, flags={"pendingTTLSeconds": str(TTL)})
SWEEP = 5.0  # Janitor's interval (controller/janitor.py), documented beside the TTL
MARGIN = 1.0  # seconds: scheduling on 2 shared cores, the 0.05 s poll
EARLY_SLACK = 0.1  # the TTL is measured on Redis's clock and the janitor's: this host's poll may see it a hair early
BOOKINGS = 11  # one every 0.5 s: a whole sweep cycle


async def test_a_booking_whose_binder_died_is_released_after_the_ttl_and_within_a_sweep_of_it(ledger: Ledger) -> None:
    await ledger.upsert_node(inventory("j1", S4000, n=4))
    mirror = Mirror(ledger)
    await mirror.start()
    await asyncio.wait_for(mirror.ready.wait(), 10)
    janitor = Janitor(ledger, mirror, CFG)
    assert janitor.interval == SWEEP
    sweeps: list[float] = []
    sweep = janitor.sweep

    async def timed_sweep() -> list[str]:
        t0 = time.monotonic()
        try:
            return await sweep()
        finally:
            sweeps.append(time.monotonic() - t0)

    janitor.sweep = timed_sweep  # type: ignore[method-assign]
    task = asyncio.create_task(janitor.run())
    loop = asyncio.get_running_loop()
    hold_ms = int((bind_deadline_s(TTL) + BIND_SETTLE_S) * 1000)  # as the extender holds one (Extender._hold_ms)
    booked: dict[str, float] = {}
    gone: dict[str, float] = {}
    try:
        for i in range(BOOKINGS):
            uid = f"p{i}"
            t0 = loop.time()
            assert (await ledger.reserve("j1", uid, [i % 4], 4, 1, 1, pod=f"ns/dead-{i}", hold_ms=hold_ms))[0].ok
            booked[uid] = t0  # (the binder dies here: no Binding, no give-back)
            await asyncio.sleep(0.5)
        end = max(booked.values()) + TTL + SWEEP + 10  # bounds a hang only: each is judged on its own below
        while len(gone) < BOOKINGS and loop.time() < end:
            snap = (await ledger.snapshots(["j1"]))["j1"]
            now = loop.time()
            for uid in booked.keys() - gone.keys() - snap.reservations.keys():
                gone[uid] = now
            await asyncio.sleep(0.05)
        assert not task.done(), task
        took = {uid: round(gone.get(uid, loop.time()) - at, 2) for uid, at in booked.items()}
        longest = max(sweeps)
        early = {u: t for u, t in took.items() if t < TTL - EARLY_SLACK}
        late = {u: t for u, t in took.items() if t > TTL + SWEEP + longest + MARGIN}
        assert not early, f"released before pendingTTLSeconds ({TTL} s): {early}"
        assert not late, (f"released later than pendingTTLSeconds + a sweep ({TTL} + {SWEEP:g} + {longest:.2f} s, "
                          f"+{MARGIN:g} s margin): {late}; all: {sorted(took.values())}")
        print(f"\nbookings of dead binders released after {sorted(took.values())} s (TTL {TTL} s, sweep {SWEEP:g} s)")
    finally:
        await cancel_and_wait([task])
        await mirror.stop()
