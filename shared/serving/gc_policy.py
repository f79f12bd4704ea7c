"""Cyclic garbage collection: what it costs each role's only thread, and keeping that small.

Every role runs one event loop on one thread, so a collection holds every request in flight. A full
(generation 2) collection walks every tracked object, and most of them are the modules a role imports
(kubernetes_asyncio alone brings tens of thousands) and the state it loads at start: measured in a burst
at 500 nodes, one full collection held the extender for ~95 ms. What lives once a role is up is frozen
(`gc.freeze`): later collections skip it, reference counting still frees it. State that arrives later (a
fleet that grows after the start: at 5,000 nodes a full collection took 130-260 ms) is frozen when the
objects a full collection would walk pass GROWN (`settle_when_grown`). The pauses are observed in
`mtsched_gc_pause_seconds{generation}`, the freezes in `mtsched_gc_freezes_total`.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable
from typing import Any

from shared.serving.metrics import GC_FREEZES, GC_PAUSE

log = logging.getLogger("mtsched")
# Objects in the oldest generation, not frozen, past which they are frozen: a full collection walks
# them all (~1 ms per 1,000 on this project's machine), and one runs every few thousand allocations
# in a busy role. 50,000: a pause of ~50 ms at most between freezes.
GROWN = 50_000

_started: list[float] = [0.0]
_pause = {g: GC_PAUSE.labels(str(g)) for g in range(3)}
# more takers of each pause as (generation, seconds): the load benchmark's fine-bucket histogram
observers: list[Callable[[int, float], None]] = []


def _on_gc(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _started[0] = time.perf_counter()
        return
    generation, took = int(info.get("generation", 2)), time.perf_counter() - _started[0]
    _pause[generation].observe(took)
    for observe in observers:
        observe(generation, took)


def install() -> None:
    """Observe every collection's pause (once per process)."""
    if _on_gc not in gc.callbacks:
        gc.callbacks.append(_on_gc)


def settle() -> int:
    """Collect what is garbage now, then freeze what is left out of later collections; the number frozen.

    Called once the imports are done and again once a role has loaded its state. Garbage made later
    is collected as before; only cycles among objects frozen here that die later are never collected
    (what a role builds at start lives as long as the role)."""
    gc.collect()
    gc.freeze()
    GC_FREEZES.inc()
    return gc.get_freeze_count()


async def settle_when_grown(period: float = 30.0, grown: int = GROWN) -> None:
    """Every `period` s: once the oldest generation holds more than `grown` objects, settle (for a
    supervisor to run). The check lists that generation (a few ms at most); the settle collects fully
    once, which is the pause it saves from then on."""
    while True:
        await asyncio.sleep(period)
        old = len(gc.get_objects(generation=2))
        if old > grown:
            frozen = settle()
            log.info("%d objects had joined the oldest generation since the last freeze: %d frozen now", old,
                     frozen)
