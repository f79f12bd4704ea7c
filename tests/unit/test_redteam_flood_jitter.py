"""Red team (floods): every retry loop of every role waited the very same times after a common failure.

The backoff (0.2 s doubling to a cap) had no jitter: after an API server or Redis outage every process that lost
it at the same moment (each watcher replica's streams, each extender's mirror, and a node agent on every GPU node,
thousands of them) retried at the same instants, 0.2, 0.6, 1.4, 3 s ... after the loss, each wave hitting the
server just back together. Now each wait is drawn between half and all of its nominal delay.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from shared.serving import supervise
from shared.serving.supervise import Backoff, Supervisor, backoff_delay


async def test_loops_that_failed_together_do_not_retry_together(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []

    async def sleep(delay: float, *_: Any) -> None:
        slept.append(delay)

    monkeypatch.setattr(supervise.asyncio, "sleep", sleep)
    for _ in range(50):  # fifty processes, each at its fourth retry
        b = Backoff()
        b.attempt = 3
        await b.sleep()
    assert len(set(slept)) > 10, sorted(set(slept))
    assert all(backoff_delay(3) / 2 <= s <= backoff_delay(3) for s in slept), slept  # bounded: the cap still holds


async def test_supervised_restarts_are_spread_too(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    real = asyncio.sleep

    async def sleep(delay: float, *_: Any) -> None:
        slept.append(delay)
        await real(0)

    sups = [Supervisor() for _ in range(20)]
    done = asyncio.Event()

    async def fails() -> None:
        if len(slept) >= 20:
            done.set()
            await real(3600)
        raise ConnectionError("the API server is away")  # transient: restarted with backoff

    monkeypatch.setattr(supervise.asyncio, "sleep", sleep)
    for sup in sups:
        sup.spawn("watch", fails)
    try:
        await asyncio.wait_for(done.wait(), 10)
    finally:
        for sup in sups:
            await sup.cancel()
    first = [s for s in slept[:20]]
    assert len(set(first)) > 5, first
