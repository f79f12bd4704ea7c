"""Mirror.stop is bounded: a cancellation its task swallows (docs/runbooks.md "lost cancellations") is sent again,
and a task that never ends is left behind after the grace instead of holding the caller for good (a role's exit,
a test's teardown: the second clean-clone CI of 2026-12-06 hung for 10 minutes with idle processes in a failover
test whose teardown stops mirrors)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from shared.store import mirror as mirror_module
from shared.store.mirror import Mirror
from tests.unit._cancels import DeafTo


def mirror_running(body: object) -> Mirror:
    m = Mirror.__new__(Mirror)  # the loop replaced: only stop() is under test
    m._task = asyncio.create_task(body)  # type: ignore[arg-type]
    return m


async def test_a_swallowed_cancellation_is_sent_again() -> None:
    deaf = DeafTo(1)
    m = mirror_running(deaf())
    await asyncio.sleep(0)
    stopping = asyncio.create_task(m.stop())
    done, _ = await asyncio.wait({stopping}, timeout=10)  # (never cancelled from here: it must end by itself)
    assert done, "stop() still waits on a task that swallowed its cancel"  # before: for ever
    assert deaf.cancels == 2 and m._task is not None and m._task.cancelled()


async def test_a_task_that_never_ends_is_left_behind(monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(mirror_module, "STOP_GRACE_SECONDS", 0.3)
    release = asyncio.Event()

    async def never() -> None:
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue

    m = mirror_running(never())
    await asyncio.sleep(0)
    with caplog.at_level(logging.ERROR, logger="mtsched.mirror"):
        stopping = asyncio.create_task(m.stop())
        done, _ = await asyncio.wait({stopping}, timeout=10)
    assert done and "did not end" in caplog.text, caplog.text
    release.set()
    assert m._task is not None
    await m._task
