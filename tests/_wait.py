"""Waiting on a condition in tests that are not end to end: poll, never sleep a fixed time for an outcome."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


async def eventually(check: Callable[[], Awaitable[bool] | bool], within: float = 10.0,
                     what: str = "") -> None:
    """Poll `check` until it holds (no timing assertions: the limit only bounds a hang)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        res = check()
        ok = await res if not isinstance(res, bool) else res
        if ok:
            return
        if loop.time() > deadline:
            raise AssertionError(f"condition never held within {within}s: {what}")
        await asyncio.sleep(0.02)
