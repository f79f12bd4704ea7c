"""The benchmark's windowed profile: our roles are signalled only when asked for, and a role profiles
exactly what runs between the two signals."""

from __future__ import annotations

import os
import pstats
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import timed_role
from bench.load.cluster import profile_window


@pytest.fixture
def handlers() -> Iterator[None]:
    """The process's own SIGUSR1/SIGUSR2 handlers, put back after the test installs the window's."""
    before = (signal.getsignal(signal.SIGUSR1), signal.getsignal(signal.SIGUSR2))
    yield
    signal.signal(signal.SIGUSR1, before[0])
    signal.signal(signal.SIGUSR2, before[1])


def _send(sig: signal.Signals) -> None:
    os.kill(os.getpid(), sig)


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_nothing_is_sent_unless_the_window_is_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MTSCHED_BENCH_PROFILE_WINDOW", raising=False)
    child = _sleeper()
    try:
        profile_window([child.pid], signal.SIGUSR1)  # would end it: the default action
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()


def test_the_roles_given_are_signalled_and_a_gone_one_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MTSCHED_BENCH_PROFILE_WINDOW", "/tmp/unused")
    gone = _sleeper()
    gone.kill()
    gone.wait()
    role = _sleeper()
    try:
        profile_window([gone.pid, role.pid], signal.SIGUSR1)  # the first: ProcessLookupError, passed over
        assert role.wait(10) == -signal.SIGUSR1
    finally:
        role.kill()
        role.wait()


def test_the_benchmark_signals_only_the_roles_it_started() -> None:
    """Target.role_pids is filled from the stack's roles alone (an external extender may be named
    extender-anything, and a Python one would die of the signal)."""
    import inspect

    from bench.load import cluster

    assert "role_pids=role_pids" in inspect.getsource(cluster.Local.target)
    assert "role_pids" not in inspect.getsource(cluster.Local.external_target)


def test_both_profiles_at_once_are_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MTSCHED_BENCH_PROFILE", str(tmp_path / "a"))
    monkeypatch.setenv("MTSCHED_BENCH_PROFILE_WINDOW", str(tmp_path / "b"))
    out = subprocess.run([sys.executable, "-m", "bench.timed_role", "extender"], capture_output=True, timeout=60)
    assert out.returncode == 2
    assert b"exclude each other" in out.stderr


@pytest.mark.usefixtures("handlers")
def test_a_failed_dump_is_said_and_the_next_window_still_opens(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "later"
    timed_role._profile_window(str(target / "p"))
    _send(signal.SIGUSR1)
    _send(signal.SIGUSR2)  # the directory does not exist: said, not raised
    target.mkdir()
    _send(signal.SIGUSR1)
    _inside()
    _send(signal.SIGUSR2)
    assert "cannot write" in capsys.readouterr().err
    assert sorted(p.name for p in target.iterdir()) == ["p.1"]


@pytest.mark.usefixtures("handlers")
def test_a_window_left_open_is_dumped_when_the_next_opens(tmp_path: Path) -> None:
    timed_role._profile_window(str(tmp_path / "p"))
    _send(signal.SIGUSR1)
    _outside()  # a phase that ended before its SIGUSR2
    _send(signal.SIGUSR1)
    _inside()
    _send(signal.SIGUSR2)
    first, second = ({fn for (_, _, fn) in pstats.Stats(str(tmp_path / n)).stats}  # type: ignore[attr-defined]
                     for n in ("p.0", "p.1"))
    assert "_outside" in first and "_inside" not in first
    assert "_inside" in second and "_outside" not in second


def _inside() -> int:
    return sum(i * i for i in range(20000))


def _outside() -> int:
    return sum(i for i in range(20000))


@pytest.mark.usefixtures("handlers")
def test_a_role_profiles_only_its_window(tmp_path: Path) -> None:
    timed_role._profile_window(str(tmp_path / "p"))
    _outside()
    _send(signal.SIGUSR1)
    _inside()
    _send(signal.SIGUSR2)
    _outside()
    _send(signal.SIGUSR2)  # no window open: nothing more is written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.0"]
    names = {fn for (_, _, fn) in pstats.Stats(str(tmp_path / "p.0")).stats}  # type: ignore[attr-defined]
    assert "_inside" in names
    assert "_outside" not in names
