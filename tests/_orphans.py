"""A test pytest-timeout ended (pyproject.toml `timeout`) is cancelled, not left running in the session's event loop,
and its alarm comes again until the test ends.

SIGALRM raises where the main thread is, for a test that waits on nothing the loop's select(): out of the runner,
with the test's task still pending in the loop every later async test shares, where it ran on (writing into the
redis-server the next tests flush). In another task's frame (one blocked in a sync call) the exception ended that
task only, and the test waited on with no alarm left: the run hung for good. Registered by tests/conftest.py;
`-p tests._orphans` elsewhere."""

from __future__ import annotations

import asyncio
import inspect
import logging
import signal
import threading
from collections.abc import Generator
from types import FrameType
from typing import Any

import pytest
import pytest_asyncio
from pytest_timeout import timeout_sigalrm

from shared.serving.supervise import cancel_and_wait

log = logging.getLogger("tests.orphans")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("timeout_again", "seconds between a timed-out test's alarms after the first (tests/_orphans.py)",
                  default="30")


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    """pytest-timeout's signal method, its alarm repeated every `timeout_again` seconds until the test ends."""
    if settings.method != "signal" or threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum: int, frame: FrameType | None) -> None:
        timeout_sigalrm(item, settings)

    def cancel() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)

    item.cancel_timeout = cancel  # type: ignore[attr-defined]  # (pytest-timeout's cancel_timer calls it)
    signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, settings.timeout, float(str(item.config.getini("timeout_again"))))
    return True


@pytest_asyncio.fixture(scope="session", loop_scope="session", autouse=True)
async def session_loop() -> asyncio.AbstractEventLoop:
    """The loop the async tests run in (asyncio_default_test_loop_scope), for `pytest_pyfunc_call`."""
    return asyncio.get_running_loop()


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Generator[None, object, object]:
    try:
        return (yield)
    finally:
        _cancel_left(pyfuncitem)


def _cancel_left(item: pytest.Function) -> None:
    """Cancel the test's task if its call ended while the task did not (a timeout's exception left the loop)."""
    loop = item.funcargs.get("session_loop")
    code = getattr(getattr(item.obj, "__wrapped__", item.obj), "__code__", None)
    if not isinstance(loop, asyncio.AbstractEventLoop) or loop.is_running() or loop.is_closed() or code is None:
        return
    left = [t for t in asyncio.all_tasks(loop)
            if inspect.iscoroutine(c := t.get_coro()) and c.cr_code is code]
    if left:
        stuck = loop.run_until_complete(cancel_and_wait(left))
        log.error("%s: its task was still running after the call ended; cancelled%s", item.nodeid,
                  " but it did not end" if stuck else "")
