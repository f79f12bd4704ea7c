"""Red team of 84c66b8 (passes start `reconcileSeconds` apart, from each one's start): a pass longer than that.

Every pass reads every node from Redis (at 5,000 nodes about 1.4 s, of which 0.9 s of Redis's one thread and 0.4 s of
the watcher's: docs/benchmarks.md, the safety-net re-reads) and compares each with the watchers' view. A pass that
takes longer than `reconcileSeconds` (thousands of nodes at the chart's smallest, 2) was followed by the next 0.5 s
after its end: each watcher's reconciler then read every node back to back, holding Redis, which every bind waits
on, two thirds of the time per watcher (before 84c66b8, `reconcileSeconds` after each end). A pass that takes more
than half of `reconcileSeconds` now waits as long as it took before the next (the watcher and Redis are the
reconciler's half of the time at most); a shorter one still starts `reconcileSeconds` after the last one's start,
which the documented drift bound counts on (tests/redis/test_heal_drift_bound.py).

Real parts: redis-server, the product's Ledger, NodeWatcher, PodWatcher, Reconciler.run; the pass itself is timed
by a stand-in of the length asked (what is checked is when the loop starts them)."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from shared.config import load_config
from shared.serving.supervise import cancel_and_wait
from shared.store.ledger import Ledger
from tests.redis.test_heal_drift_bound import GoneApi, live_reconciler

pytestmark = pytest.mark.redis

RECONCILE_SECONDS = 2  # the smallest allowed (shared/config.py, the chart's schema)
CFG = load_config(env={}, flags={"memoryPerCard": "96,160", "reconcileSeconds": str(RECONCILE_SECONDS)})
SLACK = 0.3  # seconds: scheduling on 2 shared cores


async def pass_times(ledger: Ledger, length: float, count: int) -> list[tuple[float, float]]:
    """(start, end) of the first `count` passes Reconciler.run makes, each taking `length` seconds."""
    rec = await live_reconciler(GoneApi(), ledger, CFG)  # intact: no rebuild in the loop
    times: list[tuple[float, float]] = []
    done = asyncio.Event()
    loop = asyncio.get_running_loop()

    async def a_pass() -> dict[str, int]:
        t0 = loop.time()
        await asyncio.sleep(length)
        times.append((t0, loop.time()))
        if len(times) >= count:
            done.set()
        return {}

    rec.reconcile_all = a_pass  # type: ignore[method-assign]
    task = asyncio.create_task(rec.run())
    try:
        await asyncio.wait_for(done.wait(), count * (RECONCILE_SECONDS + 2 * length) + 5)
    finally:
        await cancel_and_wait([task])
    return times[:count]


async def test_a_pass_longer_than_half_the_interval_waits_as_long_as_it_took(ledger: Ledger) -> None:
    length = 1.5  # more than reconcileSeconds / 2
    times = await pass_times(ledger, length, 3)
    gaps = [round(nxt[0] - end, 2) for (_, end), nxt in itertools.pairwise(times)]
    assert all(g >= length - 0.05 for g in gaps), f"the next pass {gaps} s after a pass of {length} s"
    assert all(g <= length + SLACK for g in gaps), gaps  # (and not later)


async def test_short_passes_still_start_reconcile_seconds_apart(ledger: Ledger) -> None:
    times = await pass_times(ledger, 0.2, 3)
    starts = [round(b[0] - a[0], 2) for a, b in itertools.pairwise(times)]
    assert all(RECONCILE_SECONDS - 0.05 <= s <= RECONCILE_SECONDS + SLACK for s in starts), starts
