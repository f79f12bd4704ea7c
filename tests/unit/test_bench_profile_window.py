"""The benchmark's windowed profile: our roles are signalled only when asked for, and a role profiles
exactly what runs between the two signals."""

from __future__ import annotations

import os
import pstats
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench import timed_role
from bench.load.cluster import profile_window


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_nothing_is_sent_unless_the_window_is_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MTSCHED_BENCH_PROFILE_WINDOW", raising=False)
    child = _sleeper()
    try:
        profile_window({"extender-0": child.pid}, signal.SIGUSR1)  # would end it: the default action
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()


def test_only_our_roles_are_signalled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MTSCHED_BENCH_PROFILE_WINDOW", "/tmp/unused")
    other, role = _sleeper(), _sleeper()
    try:
        profile_window({"kube-apiserver": other.pid, "watcher-0": role.pid, "gone-0": 2**22 + 7},
                       signal.SIGUSR1)
        assert role.wait(10) == -signal.SIGUSR1
        assert other.poll() is None
    finally:
        for c in (other, role):
            c.kill()
            c.wait()


def _inside() -> int:
    return sum(i * i for i in range(20000))


def _outside() -> int:
    return sum(i for i in range(20000))


def test_a_role_profiles_only_its_window(tmp_path: Path) -> None:
    before = (signal.getsignal(signal.SIGUSR1), signal.getsignal(signal.SIGUSR2))
    try:
        timed_role._profile_window(str(tmp_path / "p"))
        _outside()
        os.kill(os.getpid(), signal.SIGUSR1)
        _inside()
        os.kill(os.getpid(), signal.SIGUSR2)
        _outside()
        os.kill(os.getpid(), signal.SIGUSR2)  # no window open: nothing more is written
    finally:
        signal.signal(signal.SIGUSR1, before[0])
        signal.signal(signal.SIGUSR2, before[1])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.0"]
    names = {fn for (_, _, fn) in pstats.Stats(str(tmp_path / "p.0")).stats}  # type: ignore[attr-defined]
    assert "_inside" in names
    assert "_outside" not in names
