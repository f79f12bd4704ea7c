"""The janitor's sweeps are spaced by the clock each one dates and ages bookings by (`Janitor.swept_at`), never less
than the interval apart: the TTL is judged between two such clocks, and spaced by anything else (the sweeps' starts,
when the clock was read after a Redis round trip that varies) two of them fell a hair under the interval apart. With
a TTL a multiple of the interval (the defaults, 120 and 5 s) a booking then waited one sweep more than the documented
bound (shared/domain/timing.py pending_release_bound_s), about half the time. The stand-in sweep reads its clock
after a varying wait, the worst case."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any, cast

from controller.janitor import Janitor
from shared.config import load_config
from shared.serving.supervise import cancel_and_wait

INTERVAL = 0.2
ROUND_TRIPS = [0.08, 0.0, 0.05, 0.0, 0.08, 0.01]  # before each sweep's clock: slower, then faster


async def test_sweeps_clocks_are_an_interval_apart_at_least() -> None:
    # (no Redis: the sweep is stood in for, its Redis round trip before the clock with it)
    janitor = Janitor(cast(Any, None), cast(Any, None), load_config(env={}, flags={}), interval=INTERVAL)
    clocks: list[float] = []
    done = asyncio.Event()

    async def sweep() -> list[str]:
        await asyncio.sleep(ROUND_TRIPS[len(clocks)])  # the Redis round trip before the clock is read
        janitor.swept_at = time.monotonic()
        clocks.append(janitor.swept_at)
        if len(clocks) == len(ROUND_TRIPS):
            done.set()
            await asyncio.Event().wait()
        return []

    janitor.sweep = sweep  # type: ignore[method-assign]
    task = asyncio.create_task(janitor.run())
    try:
        await asyncio.wait_for(done.wait(), 30)
    finally:
        await cancel_and_wait([task])
    gaps = [b - a for a, b in itertools.pairwise(clocks)]
    assert all(g >= INTERVAL for g in gaps), gaps
