"""The ledger's upkeep stamp: written by every ready watcher, read by every extender (shared/domain/upkeep.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from shared.domain.upkeep import KEEP_EVERY_SECONDS, READ_EVERY_SECONDS, Seen, age_of, seen_again, unkept_problem
from shared.serving.metrics import LEDGER_KEPT_AGE
from shared.store.ledger import Ledger

log = logging.getLogger("mtsched.upkeep")

LOOK_EVERY_SECONDS = 1.0  # an unready watcher's look at its readiness (stamp_while_ready)
WAKE_SLACK_SECONDS = 1.0  # after the extenders' read of a stamp that ends an outage, before the watcher's wake


async def stamp_while_ready(ledger: Ledger, problems: Callable[[], list[str]],
                            every: float = KEEP_EVERY_SECONDS, look_every: float = LOOK_EVERY_SECONDS,
                            lost_after_seconds: int = 0, kept_again: Callable[[], None] | None = None,
                            wake_after: float = READ_EVERY_SECONDS + WAKE_SLACK_SECONDS,
                            progress: Callable[[], None] = lambda: None) -> None:
    """The watcher's task: stamp the ledger while the role is ready (its watch streams live, its first rebuild
    done, Redis and its permissions fine: `problems` empty), every `every` seconds; an unready watcher keeps
    nothing current, and looks again every `look_every` seconds, so it stamps as soon as it is ready (a watcher
    back after an outage: the pods turned away meanwhile wait for that stamp).

    `kept_again`: called after its first stamp since it started or was unready when the stamp it found was older
    than `lost_after_seconds` or none: the extenders may have turned slice pods away meanwhile (shared/domain/
    upkeep.py), and one that restarted since no longer knows which (its wake set is in memory), so the watcher
    nudges kube-scheduler itself (the role: with nudgeAnyNode, one Node's patch wakes them all), `wake_after` the
    stamp, once every extender has read it.

    `progress`: called after each stamp written (Supervisor.progress: a stamp that timed out during a Redis freeze no
    longer counts against the role's readiness once one works; `problems` leaves this task's own failures out, so it
    does not wait on them to stamp again)."""
    was_ready = False
    while True:
        if not problems():
            stale = False
            if not was_ready and kept_again is not None:
                try:
                    _, age = await ledger.kept()
                except Exception as e:  # (the stamp below says whether Redis works; this only decides a nudge)
                    log.info("upkeep: could not read the last stamp (%s): nudging kube-scheduler anyway", e)
                    age = None
                stale = age is None or age > lost_after_seconds * 1000
            await ledger.mark_kept()
            was_ready = True
            if stale and kept_again is not None:
                # once every extender has read this stamp (each reads every READ_EVERY_SECONDS): a retry before
                # that met an extender still refusing, and waited again
                log.info("upkeep: the ledger is kept again after no watcher kept it: waking the pods turned away "
                         "in %.0f s", wake_after)
                asyncio.get_running_loop().call_later(wake_after, kept_again)
            progress()
            await asyncio.sleep(every)
        else:
            was_ready = False
            await asyncio.sleep(min(every, look_every))


class Upkeep:
    """The extender's view of the stamp: `problem()` is why no slice pod may be placed now ("" when one may).

    The stamp's age is Redis's clock minus the stamp (Ledger.kept), and also, on this process's own clock, how
    long the stamp read has not changed, or could not be read (each watcher writes a new one every 10 s): the
    larger counts. Redis's clock alone read a stamp from its future (the clock stepped back since, or a failover
    to a server whose clock is behind) as 0 s old for as long as the step, and a stamp gone after being seen (a
    DEL, the key's shard restarted empty) as no verdict: with every watcher down the extenders went on booking
    (tests/redis/test_redteam_upkeep.py). A stamp never seen since this process started is still no verdict."""

    def __init__(self, ledger: Ledger, lost_after_seconds: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ledger = ledger
        self.lost_after = lost_after_seconds
        self._problem = ""
        self.on_kept: list[Callable[[], None]] = []  # called when a watcher keeps the ledger again
        self._clock = clock
        self._seen: Seen | None = None  # the last stamp read, dated on this process's clock
        self.on_progress: Callable[[], None] = lambda: None  # after each read that worked (Supervisor.progress)
        LEDGER_KEPT_AGE.set(-1)

    def problem(self) -> str:
        return self._problem

    def _age_ms(self, stamp: int | None, age: int | None) -> int | None:
        """The stamp's age (ms) after a read that found `stamp`, `age` ms old on Redis's clock (shared/domain/upkeep.py
        seen_again); None when no stamp was ever read."""
        now = self._clock()
        self._seen = seen_again(self._seen, stamp, age, now)
        return age_of(self._seen, now)

    async def read(self) -> None:
        """Read the stamp once. A read that fails is raised (the supervisor restarts the task, the role unready
        after a while) after the verdict is judged on this process's count alone: a stamp that cannot be read
        ages like one that does not change (on a Cluster whose shard holding it is down, the other shards' nodes
        would book on)."""
        try:
            stamp, age = await self.ledger.kept()
        except Exception:
            self._judge(self._age_ms(None, None))
            raise
        self._judge(self._age_ms(stamp, age))

    def _judge(self, age: int | None) -> None:
        LEDGER_KEPT_AGE.set(-1 if age is None else age / 1000)
        problem, was = unkept_problem(age, self.lost_after), self._problem
        if problem and not was:
            log.warning("placing no slice pod: %s", problem)
        self._problem = problem
        if was and not problem:
            log.warning("a watcher keeps the ledger current again: placing slice pods")
            for call in self.on_kept:
                call()

    async def run(self, every: float = READ_EVERY_SECONDS) -> None:
        while True:
            await self.read()
            self.on_progress()
            await asyncio.sleep(every)
