"""A Redis outage resends every call in flight about ten times: the log says so once a second per operation (with
how many lines it stands for), the counter mtsched_redis_resends_total counts every resend. A line per resend was
hundreds of lines a second on a busy extender (left open in the ninth session's note)."""

from __future__ import annotations

import asyncio
import logging
import time
from types import SimpleNamespace

import fakeredis
import pytest
from redis import exceptions as rexc

from shared.serving.metrics import REDIS_RESENDS
from shared.store.ledger import Ledger


def _failing_then(value: int, failures: int) -> object:
    left = [failures]

    async def op() -> int:
        if left[0]:
            left[0] -= 1
            raise rexc.ConnectionError("Connection refused")
        return value
    return op


@pytest.mark.asyncio
async def test_resends_are_counted_each_and_logged_once_per_operation(caplog: pytest.LogCaptureFixture,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # the ledger's clock stands still: the lines are counted per second of it, not of how long this machine takes
    # (a wall-clock run of 10 s or more, a loaded machine, had as many lines: a timed upper bound)
    # (the ledger module's own `time`: the event loop's clock goes on)
    monkeypatch.setattr("shared.store.ledger_core.time", SimpleNamespace(monotonic=lambda: 1000.0, time=time.time,
                                                                     time_ns=time.time_ns))
    ledger = Ledger(fakeredis.FakeAsyncRedis(decode_responses=True))
    before = REDIS_RESENDS.labels("reserve")._value.get()
    calls, each = 40, 3
    with caplog.at_level(logging.WARNING, logger="mtsched.ledger"):
        got = await asyncio.gather(*(ledger._retry("reserve", _failing_then(i, each))  # type: ignore[arg-type]
                                     for i in range(calls)))
    assert got == list(range(calls))  # every call still went through
    assert REDIS_RESENDS.labels("reserve")._value.get() - before == calls * each
    lines = [r.getMessage() for r in caplog.records if "sending again" in r.getMessage()]
    # 120 resends within one second of the ledger's clock: a line each before; one now
    assert len(lines) == 1, lines


def test_a_later_line_says_how_many_it_stands_for(caplog: pytest.LogCaptureFixture,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = Ledger(fakeredis.FakeAsyncRedis(decode_responses=True))
    clock = [1000.0]
    monkeypatch.setattr("shared.store.ledger_core.time.monotonic", lambda: clock[0])
    e = rexc.ConnectionError("gone")
    with caplog.at_level(logging.WARNING, logger="mtsched.ledger"):
        ledger._say_resend("release", e, 1)
        for _ in range(7):
            ledger._say_resend("release", e, 2)
        ledger._say_resend("reserve", e, 1)  # another operation has a line of its own
        clock[0] += 1.5
        ledger._say_resend("release", e, 3)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines
    assert lines[0].startswith("release: gone; sending again (1)") and "not logged" not in lines[0]
    assert lines[1].startswith("reserve: gone; sending again (1)")
    assert "7 more resends of release in the last 1.5s not logged" in lines[2]
