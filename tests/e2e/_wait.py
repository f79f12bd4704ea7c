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
    return await _poll(check, lambda got: got is not None, what, details, timeout)


async def until_true(check: Callable[[], Awaitable[Any]], what: str, details: Callable[[], str] | None = None,
                     timeout: float = 30.0) -> Any:
    """As `until`, for a `check()` that answers something false (False, None, an empty list) until it holds:
    its first true answer."""
    return await _poll(check, bool, what, details, timeout)


async def _poll(check: Callable[[], Awaitable[Any]], done: Callable[[Any], bool], what: str,
                details: Callable[[], str] | None, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while not done(got := await check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{details() if details else ''}")
        await asyncio.sleep(0.2)
    return got
