"""`within`: asyncio.wait_for without the flaw it has on Python 3.11 (the image's and CI's Python).

3.11's wait_for runs its awaitable in a task of its own and, when the waiting task is cancelled at the moment that
task completes, returns the result and drops the cancel: the caller goes on as if never cancelled
(bench/cancel_probe.py; fixed in 3.12, where wait_for is built on asyncio.timeout). `asyncio.timeout` runs the
awaitable in the caller's own task, so a cancel always reaches it, and spends no task per call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def within(aw: Awaitable[T], seconds: float | None) -> T:
    """`await aw`, raising TimeoutError after `seconds` (None: no limit)."""
    if seconds is None:
        return await aw
    async with asyncio.timeout(seconds):
        return await aw
