"""`mtsched cards` (runbook "A pod stays Pending", step 3) with Redis out of reach says so in one line and exits 1,
as `mtsched explain` does: it printed a redis-py traceback (exit 1 only as Python's uncaught exception), which an
operator reading the runbook takes for a bug of the command, and a standalone Redis that accepts and never
answers (the 5 s socket timeout) ended in a TimeoutError traceback too (red team, observability)."""

from __future__ import annotations

import socket

import pytest

from controller import cli


def _listening_silent() -> socket.socket:
    """A port that accepts connections (the kernel's backlog) and never answers: a hanging Redis."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    return s


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


def test_cards_with_redis_refusing(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"redis://127.0.0.1:{_free_port()}"
    assert cli.main(["cards", "--redis-url", url, "--log-format", "text"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]  # (the ledger's retries are logged before it, on stderr too)
    assert last.startswith("mtsched cards: ConnectionError: "), err


def test_cards_with_redis_hanging(capsys: pytest.CaptureFixture[str]) -> None:
    silent = _listening_silent()
    try:
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}"
        assert cli.main(["cards", "--redis-url", url, "--log-format", "text"]) == 1
    finally:
        silent.close()
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("mtsched cards: ") and "Timeout" in last, err
