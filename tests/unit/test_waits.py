"""`within` keeps a cancel that meets the completion of what it waits for; Python 3.11's asyncio.wait_for drops it,
and redis-py's connection module sends under `within` (shared/store/redis_conn.py `_keep_cancels`)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio.connection as connection_module

import shared.store.redis_conn  # noqa: F401 (installs _keep_cancels)
from shared.serving.waits import within


async def cancelled_as_it_completes(wait: Callable[[Awaitable[int], float], Awaitable[Any]]) -> asyncio.Task[Any]:
    """A task waiting (with `wait`, 5 s) on a future that completes in the same turn as the task is cancelled."""
    fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(wait(fut, 5.0))
    await asyncio.sleep(0)  # the task waits now
    fut.set_result(1)
    task.cancel()
    await asyncio.wait({task})
    return task


async def test_within_keeps_a_cancel_that_meets_the_completion() -> None:
    task = await cancelled_as_it_completes(within)
    assert task.cancelled()


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="installed on 3.11 only")
async def test_redis_connections_wait_keeps_it_with_wait_fors_parameters() -> None:
    shim_wait_for = getattr(connection_module, "asyncio").wait_for  # noqa: B009
    task = await cancelled_as_it_completes(lambda fut, seconds: shim_wait_for(fut, timeout=seconds))
    assert task.cancelled()


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12's wait_for is built on asyncio.timeout")
async def test_python_311_wait_for_drops_it() -> None:  # why `within` exists
    task = await cancelled_as_it_completes(asyncio.wait_for)
    assert not task.cancelled() and task.result() == 1


async def test_within_times_out_and_passes_through() -> None:
    with pytest.raises(TimeoutError):
        await within(asyncio.sleep(1), 0.01)
    assert await within(asyncio.sleep(0, "x"), 1.0) == "x"
    assert await within(asyncio.sleep(0, "y"), None) == "y"


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="installed on 3.11 only")
def test_redis_connections_send_under_within() -> None:
    shim = getattr(connection_module, "asyncio")  # noqa: B009
    assert shim.wait_for.__qualname__ == "_keep_cancels.<locals>.wait_for"
    assert shim.TimeoutError is asyncio.TimeoutError and shim.CancelledError is asyncio.CancelledError
