"""Red team, today's changes: the ledger logs a Redis outage's resends once a second per operation, each line saying
how many resends held back before it it stands for. The ones held back after an outage's last line were told by no
line (no later resend came to say how many): a burst shorter than a second logged one line for 120 resends, and the
runbook's "saying how many resends it stands for" was false for the tail. Now the line owed comes when the second
ends; every resend is told by some line."""

from __future__ import annotations

import asyncio
import logging
import re

import fakeredis
import pytest

import shared.store.ledger_core as ledger_module
from shared.store.ledger import Ledger
from tests._wait import eventually
from tests.unit.test_ledger_resend_log import _failing_then


def told(messages: list[str], what: str) -> int:
    """How many resends of `what` the log lines account for."""
    n = 0
    for m in messages:
        if not m.startswith(f"{what}: "):
            continue
        if "sending again" in m:
            n += 1
        more = re.search(r"(\d+) more resends", m)
        if more:
            n += int(more.group(1))
    return n


@pytest.mark.asyncio
async def test_redteam_today2_every_resend_is_told_by_some_line(caplog: pytest.LogCaptureFixture,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ledger_module, "RESEND_LOG_EVERY_S", 0.2)
    ledger = Ledger(fakeredis.FakeAsyncRedis(decode_responses=True))
    calls, each = 40, 3
    with caplog.at_level(logging.WARNING, logger="mtsched.ledger"):
        await asyncio.gather(*(ledger._retry("reserve", _failing_then(i, each))  # type: ignore[arg-type]
                               for i in range(calls)))
        await eventually(lambda: told(caplog.messages, "reserve") == calls * each, within=10,
                         what=f"lines telling all {calls * each} resends: {caplog.messages}")
    assert told(caplog.messages, "reserve") == calls * each
    assert ledger._resend_due == {}  # nothing left owed
