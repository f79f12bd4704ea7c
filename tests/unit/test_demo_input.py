"""`mtsched demo` refuses a wrong --memory-per-card before it starts anything (a new-user test: `abc` started the
whole control plane, then failed with a traceback under a page of logs)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

import deploy.local.demo as demo


@pytest.mark.parametrize(("value", "says"), [
    ("abc", "'abc' is not a whole number of 512 MiB units (2..4096"),
    ("", "memoryPerCard is empty"),
    ("96,48", "entry 48 is MTT S4000's memory in GiB; the unit is 512 MiB: use 96"),
    ("1", "out of range"),
])
def test_a_wrong_memory_per_card_starts_nothing(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                                value: str, says: str) -> None:
    def started(*_: object, **__: object) -> None:
        raise AssertionError("the demo began to start the control plane")

    monkeypatch.setattr(demo, "ensure_binaries", started)
    assert demo.run_demo(value) == 2
    err = capsys.readouterr().err
    assert err.startswith("mtsched demo: --memory-per-card: ") and says in err, err


class _Started:
    """Stands in for a process the demo starts: records its stop, during which the user signals again."""

    def __init__(self, log: list[str], name: str, again: tuple[signal.Signals, ...] = ()) -> None:
        self.log, self.name, self.again = log, name, again
        self._procs = [1]

    def start(self) -> None:
        self.log.append(f"{self.name} started")
        if self.name == "control plane":  # the user gives up while it comes up
            os.kill(os.getpid(), signal.SIGTERM)
            raise AssertionError("SIGTERM did not interrupt the demo")

    def stop(self) -> None:
        for sig in self.again:  # impatient: a second SIGTERM, a SIGHUP and a Ctrl-C while it cleans up
            os.kill(os.getpid(), sig)
        self.log.append(f"{self.name} stopped")

    cleanup = stop

    def log_tails(self, _n: int) -> str:
        return ""


@pytest.fixture
def handlers() -> Iterator[None]:
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


@pytest.mark.usefixtures("handlers")
def test_a_signal_during_cleanup_does_not_cut_it_short(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    log: list[str] = []
    again = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
    monkeypatch.setattr(demo, "ensure_binaries", lambda **_: Path("/nonexistent"))
    monkeypatch.setattr(demo, "ControlPlane", lambda **_: _Started(log, "control plane", again))
    monkeypatch.setattr(demo, "RedisServer", lambda **_: _Started(log, "redis", again))
    monkeypatch.setattr(demo, "new_password", lambda: "x")
    assert demo.run_demo("96,160") == 130
    assert log == ["control plane started", "redis stopped", "control plane stopped"]
    assert "everything it started is stopped" in capsys.readouterr().err
