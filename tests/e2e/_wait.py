"""Waiting on a condition in e2e tests: poll, never sleep a fixed time, and say what never came."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any


async def until(check: Callable[[], Awaitable[Any]], what: str, details: Callable[[], str] | None = None,
                timeout: float = 30.0) -> Any:
    """`check()`'s first answer that is not None; AssertionError naming `what` (and `details()`, e.g. the
    stack's logs) when none comes within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while (got := await check()) is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{details() if details else ''}")
        await asyncio.sleep(0.2)
    return got
