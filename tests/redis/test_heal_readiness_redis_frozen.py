"""The documented readiness bounds of the extender while Redis is away, measured on its real Redis parts (the
session of `open_ledger`: the probe write, the mirror and its feed; and `spawn_upkeep`, its reader of the watchers'
stamp, wired as `run_extender` wires it) under a Supervisor, against a real redis-server.

docs/runbooks.md, "Faults": `/readyz` 503 within 6.2 s of Redis stopping to answer, and ready again within 11 s of
Redis answering (a task that failed meanwhile waits out its restart backoff, at most 10 s, and counts as working at
its first round trip that succeeds; the mirror reconnects within 5 s and re-reads); "Mirrors": a feed that answers
nothing is noticed within 22 s. The faults here last until the worst case of the code path is reached, not the
short freeze the fault matrix measures (tests/e2e/test_faults.py, ~6 s):

- frozen (SIGSTOP) until the upkeep task has failed slowly three times (each of its reads waits out the socket
  timeout and the ledger's resends, ~15 s): before `Supervisor.progress`, that kept the extender unready for 60 s
  (`proven_after`) after Redis answered again, its first read that worked notwithstanding (red team, heal times);
- down (connections refused) until the task's restart backoff is at its cap (10 s), then started again, empty.

Each wait is on a condition with a deadline of the documented bound plus a stated margin: a correctness bound, not a
speed benchmark (the margin covers 2 shared cores). The frozen case takes about a minute, by its nature."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable

import pytest

from controller.roles import spawn_upkeep
from deploy.local.redis import RedisServer, new_password
from shared.config import load_config
from shared.serving.supervise import Supervisor
from shared.store.mirror import FEED_SILENCE_SECONDS
from shared.store.session import open_ledger

pytestmark = pytest.mark.redis

UNREADY_WITHIN = 6.2  # docs/runbooks.md, Faults, "Redis stops answering (SIGSTOP)"
READY_AGAIN_WITHIN = 11.0  # ibid.: ready again after Redis answers
FEED_NOTICED_WITHIN = 2 * FEED_SILENCE_SECONDS + 2  # docs/runbooks.md, Mirrors: "noticed within 22 s"
MARGIN = 1.5  # seconds on top of each documented bound: scheduling on 2 shared cores, the 0.05 s poll
SETUP_LIMIT = 150.0  # only bounds a hang while the fault is brought to its worst case (not a documented bound)


async def _within(what: str, cond: Callable[[], bool], bound: float, margin: float = MARGIN) -> float:
    """Seconds until `cond()` holds; fails past `bound` + `margin`."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    end = t0 + bound + margin
    while not cond():
        assert loop.time() < end, f"not within {bound:g} s (+{margin:g} s margin): {what}"
        await asyncio.sleep(0.05)
    return loop.time() - t0


@pytest.mark.parametrize("fault", ["frozen", "down"])
async def test_the_extender_is_unready_while_redis_is_away_and_ready_again_within_the_bound(fault: str) -> None:
    server = RedisServer(password=new_password()).start()
    cfg = load_config(env={}, flags={"redisUrl": server.url})
    sup = Supervisor()
    opened = None
    proc = server.proc
    assert proc is not None
    frozen = False
    try:
        opened = await asyncio.wait_for(open_ledger(cfg, sup), 10)
        ledger, mirror = opened
        spawn_upkeep(sup, ledger, cfg)
        await _within("ready at start", lambda: not sup.problems(), 10)
        upkeep = sup.tasks["upkeep"]
        silences = mirror.silences

        if fault == "frozen":
            os.kill(proc.pid, signal.SIGSTOP)
            frozen = True
        else:
            await asyncio.to_thread(server.kill)
        unready = await _within("unready once Redis stops answering", lambda: bool(sup.problems()), UNREADY_WITHIN)
        # and says why: the probe, or the mirror (a refused connection is seen by it first)
        assert any(p.startswith(("redis: ", "mirror: ")) for p in sup.problems()), sup.problems()

        if fault == "frozen":
            # counted from the freeze: the feed's last message may be older still, so this is the documented bound
            await _within("the mirror notices its silent feed", lambda: mirror.silences > silences,
                          FEED_NOTICED_WITHIN - unready)
            assert not mirror.ready.is_set()
            await _within("the upkeep task has failed slowly three times", lambda: upkeep.slow_failures >= 3,
                          SETUP_LIMIT)
            os.kill(proc.pid, signal.SIGCONT)
            frozen = False
        else:
            await _within("the upkeep task's restart backoff is at its cap", lambda: upkeep.failures >= 7,
                          SETUP_LIMIT)
            await asyncio.to_thread(server.start)  # the same port, empty (no persistence)
        problems_then = sup.problems()
        again = await _within(f"ready again once Redis answers (unready then for: {problems_then})",
                              lambda: not sup.problems(), READY_AGAIN_WITHIN)
        print(f"\n{fault}: unready after {unready:.1f}s; ready again {again:.1f}s after Redis answered")
    finally:
        if frozen:
            os.kill(proc.pid, signal.SIGCONT)
        await sup.cancel()
        if opened is not None:
            ledger, mirror = opened
            await ledger.redis.aclose()
            await mirror.subscriber.aclose()
        server.cleanup()
