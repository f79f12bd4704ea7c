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


async def test_a_slowly_failed_task_is_ready_again_at_its_first_unit_of_work_and_not_before() -> None:
    """Red team, heal times: a task whose Redis round trips timed out during a freeze failed slowly three times, and
    the role stayed unready for `proven_after` (60 s) after Redis answered again, its work going fine meanwhile
    (tests/redis/test_heal_readiness_redis_frozen.py). A unit of work that succeeds (`Supervisor.progress`) ends it
    at once; a task that keeps failing slowly reports none and stays a problem."""
    sup = Supervisor(unready_after=0.1, healthy_after=0.05, proven_after=3600.0, max_backoff=0.01)
    progress = sup.progress("upkeep")
    healthy = asyncio.Event()
    worked = asyncio.Event()

    async def body() -> None:
        while not healthy.is_set():
            await asyncio.sleep(0.08)  # longer than healthy_after, then the read times out
            if not healthy.is_set():
                raise TimeoutError("Timeout reading from redis")
        while True:  # Redis answers: each read works
            progress()
            worked.set()
            await asyncio.sleep(0.01)

    sup.spawn("upkeep", body)
    try:
        await eventually(lambda: bool(sup.problems()), within=30, what="the role unready")
        assert any("upkeep failed 3 times" in p for p in sup.problems()), sup.problems()
        await asyncio.sleep(0.3)  # more slow failures, no progress: still unready
        assert sup.problems()
        healthy.set()
        await asyncio.wait_for(worked.wait(), 30)
        assert sup.problems() == [], sup.problems()  # at its first unit of work, not proven_after later
    finally:
        await sup.cancel()


async def test_the_upkeep_asks_about_the_rest_of_the_role_and_stamps_again_after_its_own_failure() -> None:
    """The watchers' upkeep stamps only while the role is ready. Asked with its own failed stamp counted, it waited on
    that failure, so it never stamped again (and never made the progress that ends it) until the failure aged out:
    `problems(but=...)` leaves that one task's failures out, and only those."""
    sup = Supervisor(unready_after=0.0, healthy_after=3600.0, proven_after=3600.0, max_backoff=0.01)
    stamps: list[bool] = []
    fail = [True]

    async def upkeep() -> None:
        while True:
            if not sup.problems(but="upkeep"):
                if fail[0]:
                    raise TimeoutError("Timeout reading from redis")
                stamps.append(True)
                sup.note_ok("upkeep")
            await asyncio.sleep(0.01)

    async def other() -> None:
        raise ConnectionError("Redis is down")

    sup.spawn("upkeep", upkeep)
    try:
        await eventually(lambda: any("upkeep" in p for p in sup.problems()), within=30, what="the stamp failed")
        assert sup.problems(but="upkeep") == []  # its own failure left out, nothing else failing
        fail[0] = False
        await eventually(lambda: bool(stamps) and sup.problems() == [], within=30, what="stamped again, ready")
        sup.spawn("other", other)
        await eventually(lambda: any("other" in p for p in sup.problems(but="upkeep")), within=30,
                         what="another task's failure still counts")
    finally:
        await sup.cancel()
