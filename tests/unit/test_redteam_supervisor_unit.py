"""Red team: a supervised task that failed once and then runs fine must not keep its role unready.

`Supervisor._guard` sets `failing_since` when a task stops and clears it only when the task stops *again*
after `healthy_after` seconds (or through `note_ok`, which no role calls). A long-running loop (the
reconciler, the janitor) that recovered from one Redis error therefore counts as "failing" for ever, and
`/readyz` answers 503 for good (seen on the real stack: "task reconciler failing for 145s" two minutes
after Redis came back, while the reconciler was repairing nodes).
"""

from __future__ import annotations

import asyncio

from redis import exceptions as rexc

from shared.serving.supervise import Supervisor


async def test_a_task_that_recovered_does_not_count_as_failing() -> None:
    sup = Supervisor(unready_after=0.5, healthy_after=1.0)
    started = 0
    running = asyncio.Event()

    async def body() -> None:
        nonlocal started
        started += 1
        if started == 1:
            raise rexc.ConnectionError("Redis restarted")  # one transient error
        running.set()
        await asyncio.Event().wait()  # works from now on, as the reconciler's loop does

    sup.spawn("reconciler", body)
    try:
        await asyncio.wait_for(running.wait(), 5)
        await asyncio.sleep(2.5)  # past unready_after, and running fine for longer than healthy_after
        assert started == 2
        assert sup.problems() == [], sup.problems()
    finally:
        await sup.cancel()
