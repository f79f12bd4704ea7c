"""Review: what a webhook request holds of its BodyBudget is given back on every way its handler ends, not only on an
answer: the caller gone mid-body (closed, reset, half-closed) and the handler failing after the read (a bug: 500).
A charge never given back would leave the webhook answering 503 to everyone for ever."""

from __future__ import annotations

import asyncio
import socket
import struct

import pytest

import webhook.server
from shared.serving.http import BODY_BUDGET, serve
from tests._wait import eventually
from tests.unit._servers import webhook_app
from tests.unit.test_redteam_http_body_budget import _hold, _post, _review

BODY = _review(b"[" + b",".join([b'"v"'] * 50_000) + b"]")  # ~200 KB


@pytest.mark.parametrize("ending", ["close", "reset", "half-close"])
async def test_a_caller_gone_mid_body_gives_its_charge_back(ending: str) -> None:
    app = webhook_app()
    budget = app[BODY_BUDGET]
    runner = await serve(app, "127.0.0.1:0")
    port = runner.addresses[0][1]
    try:
        w = await _hold(budget, port, "127.0.0.2", BODY)
        assert budget.held > 0
        if ending == "reset":
            w.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            w.close()
        elif ending == "half-close":
            w.write_eof()
        else:
            w.close()
        await eventually(lambda: budget.held == 0 and not budget.peers, what="the charge given back")
        assert await _post(port, "127.0.0.2", BODY) == 200
        w.close()
    finally:
        await runner.cleanup()


async def test_a_handler_that_fails_after_the_read_gives_its_charge_back(monkeypatch: pytest.MonkeyPatch) -> None:
    app = webhook_app()
    budget = app[BODY_BUDGET]
    runner = await serve(app, "127.0.0.1:0")
    port = runner.addresses[0][1]

    def broken(*_: object, **__: object) -> object:
        raise RuntimeError("a bug")

    try:
        with monkeypatch.context() as m:
            m.setattr(webhook.server, "handle_review", broken)
            assert await _post(port, "127.0.0.2", BODY) == 500
        assert budget.held == 0 and not budget.peers
        for _ in range(3):  # and keep-alive or not, the next ones are judged
            assert await _post(port, "127.0.0.2", BODY) == 200
        await asyncio.sleep(0)
        assert budget.held == 0
    finally:
        await runner.cleanup()
