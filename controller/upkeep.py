"""The ledger's upkeep stamp: written by every ready watcher, read by every extender (shared/domain/upkeep.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from shared.domain.upkeep import KEEP_EVERY_SECONDS, READ_EVERY_SECONDS, unkept_problem
from shared.serving.metrics import LEDGER_KEPT_AGE
from shared.store.ledger import Ledger

log = logging.getLogger("mtsched.upkeep")


async def stamp_while_ready(ledger: Ledger, problems: Callable[[], list[str]],
                            every: float = KEEP_EVERY_SECONDS) -> None:
    """The watcher's task: stamp the ledger while the role is ready (its watch streams live, its first rebuild
    done, Redis and its permissions fine: `problems` empty); an unready watcher keeps nothing current."""
    while True:
        if not problems():
            await ledger.mark_kept()
        await asyncio.sleep(every)


class Upkeep:
    """The extender's view of the stamp: `problem()` is why no slice pod may be placed now ("" when one may)."""

    def __init__(self, ledger: Ledger, lost_after_seconds: int) -> None:
        self.ledger = ledger
        self.lost_after = lost_after_seconds
        self._problem = ""
        self.on_kept: list[Callable[[], None]] = []  # called when a watcher keeps the ledger again
        LEDGER_KEPT_AGE.set(-1)

    def problem(self) -> str:
        return self._problem

    async def read(self) -> None:
        """Read the stamp once (an error leaves the last verdict: Redis away fails every booking anyway)."""
        age = await self.ledger.kept_age_ms()
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
            await asyncio.sleep(every)
