"""Red team: a supervised task that failed once and then runs fine must not keep its role unready.

`Supervisor._guard` sets `failing_since` when a task stops and clears it only when the task stops *again*
after `healthy_after` seconds (or through `note_ok`, which no role calls). A long-running loop (the
reconciler, the janitor) that recovered from one Redis error therefore counts as "failing" for ever, and
`/readyz` answers 503 for good (seen on the real stack: "task reconciler failing for 145s" two minutes
after Redis came back, while the reconciler was repairing nodes).
"""

from __future__ import annotations

import asyncio
import time

from redis import exceptions as rexc

from shared.serving.supervise import Supervisor
from tests._wait import eventually


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
        await asyncio.wait_for(running.wait(), 30)
        failed_at = sup.tasks["reconciler"].failing_since
        assert failed_at is not None  # it failed once
        # running fine for longer than healthy_after: not failing any more (for ever, before the fix)
        await eventually(lambda: sup.tasks["reconciler"].failing_since is None, within=30, what="failing cleared")
        await asyncio.sleep(max(0.0, failed_at + sup.unready_after + 0.1 - time.monotonic()))  # past unready_after
        assert started == 2
        assert sup.problems() == [], sup.problems()
    finally:
        await sup.cancel()


async def test_a_task_that_always_fails_after_running_a_while_makes_the_role_unready() -> None:
    """Red team (2026-12-05): each run longer than `healthy_after` cleared the task's failing state, so a task
    that failed every time, slowly (the reconciler's pass whose API reads time out), never showed in /readyz.
    Three such runs in a row now do, until a run lasts `proven_after` (or the task says it made progress)."""
    sup = Supervisor(unready_after=0.1, healthy_after=0.05, proven_after=0.6, max_backoff=0.01)
    runs = 0
    healthy = asyncio.Event()

    async def body() -> None:
        nonlocal runs
        runs += 1
        if healthy.is_set():
            await asyncio.Event().wait()
        await asyncio.sleep(0.08)  # longer than healthy_after, then the read times out
        raise TimeoutError("the API server did not answer")

    sup.spawn("reconciler", body)
    try:
        await eventually(lambda: bool(sup.problems()), within=30, what="the role unready")
        assert runs >= 3 and any("reconciler failed" in p and "did not answer" in p for p in sup.problems())
        healthy.set()  # the API server answers again: the next run keeps going
        await eventually(lambda: not sup.problems(), within=30, what="the role ready again")
    finally:
        await sup.cancel()
