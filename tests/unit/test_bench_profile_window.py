"""The benchmark's windowed profile: our roles are signalled only when asked for, and a role profiles
exactly what runs between the two signals."""

from __future__ import annotations

import os
import pstats
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench import timed_role
from bench.load.cluster import profile_window


@pytest.fixture
def handlers() -> Iterator[None]:
    """The process's own SIGUSR1/SIGUSR2/SIGPROF handlers, put back after the test installs the window's."""
    before = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGPROF)}
    yield
    signal.setitimer(signal.ITIMER_PROF, 0, 0)
    for s, h in before.items():
        signal.signal(s, h)


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


def test_the_sampled_window_signals_the_roles_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MTSCHED_BENCH_PROFILE_WINDOW", raising=False)
    monkeypatch.setenv("MTSCHED_BENCH_SAMPLE_WINDOW", "/tmp/unused")
    role = _sleeper()
    try:
        profile_window([role.pid], signal.SIGUSR2)
        assert role.wait(10) == -signal.SIGUSR2
    finally:
        role.kill()
        role.wait()


def test_the_sampler_and_the_windowed_cprofile_exclude_each_other(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    monkeypatch.setenv("MTSCHED_BENCH_SAMPLE_WINDOW", str(tmp_path / "a"))
    monkeypatch.setenv("MTSCHED_BENCH_PROFILE_WINDOW", str(tmp_path / "b"))
    out = subprocess.run([sys.executable, "-m", "bench.timed_role", "extender"], capture_output=True, timeout=60)
    assert out.returncode == 2
    assert b"exclude each other" in out.stderr


def _stacks(path: Path) -> dict[str, int]:
    out = {}
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        out[stack] = int(n)
    return out


def _burn(seconds: float, fn: Callable[[], int]) -> None:
    """Run fn until this process has used `seconds` of CPU (a CPU-time sampler samples only that)."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        fn()


@pytest.mark.usefixtures("handlers")
def test_the_sampler_counts_the_cpu_time_of_what_runs_in_its_window_only(tmp_path: Path) -> None:
    timed_role._sample_window(str(tmp_path / "s"), interval=0.002)
    _burn(0.1, _outside)
    _send(signal.SIGUSR1)
    _burn(0.3, _inside)
    _send(signal.SIGUSR2)
    _burn(0.1, _outside)
    _send(signal.SIGUSR2)  # no window open: nothing more is written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.0"]
    stacks = _stacks(tmp_path / "s.0")
    inside = sum(n for k, n in stacks.items() if "_inside" in k)
    assert not any("_outside" in k for k in stacks)
    # ~150 samples of 2 ms in 0.3 s of CPU; the frames are outermost first, as flame graphs read them
    assert inside >= 50
    assert all(k.split(";")[-1].startswith(("_inside", "<genexpr>")) for k in stacks if "_inside" in k)


@pytest.mark.usefixtures("handlers")
def test_a_tick_that_lands_in_the_samplers_own_handler_is_not_counted(tmp_path: Path) -> None:
    """Red team (flaky under CPU load): a SIGPROF that came while the handler was taking the sample before ran the
    handler again on top of it, and the sampler's own CPU time was counted as a stack of the code it interrupted
    (`...;_inside;<genexpr>;sample`). Made deterministic: the handler is handed its own frame, as it is then."""
    timed_role._sample_window(str(tmp_path / "s"), interval=100.0)  # no tick of its own in this test
    sample = signal.getsignal(signal.SIGPROF)
    assert callable(sample)
    _send(signal.SIGUSR1)
    here = sys._getframe()
    sample(signal.SIGPROF, here)  # a tick in this test's code: counted
    sample(signal.SIGPROF, SimpleNamespace(f_code=sample.__code__, f_back=here))  # a tick in the handler: not
    _send(signal.SIGUSR2)
    stacks = _stacks(tmp_path / "s.0")
    assert sum(stacks.values()) == 1, stacks
    (only,) = stacks
    assert only.split(";")[-1].startswith("test_a_tick_that_lands_in_the_samplers_own_handler_is_not_counted")


@pytest.mark.usefixtures("handlers")
def test_a_sampled_window_left_open_is_dumped_when_the_next_opens(tmp_path: Path) -> None:
    timed_role._sample_window(str(tmp_path / "s"), interval=0.002)
    _send(signal.SIGUSR1)
    _burn(0.1, _outside)
    _send(signal.SIGUSR1)
    _burn(0.1, _inside)
    _send(signal.SIGUSR2)
    first, second = _stacks(tmp_path / "s.0"), _stacks(tmp_path / "s.1")
    assert any("_outside" in k for k in first) and not any("_inside" in k for k in first)
    assert any("_inside" in k for k in second) and not any("_outside" in k for k in second)


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


def test_stacks_gives_inclusive_and_self_shares(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bench import stacks

    f = tmp_path / "s.0"
    f.write_text("main (/x/a.py:1);handle (/x/b.py:2);parse (/usr/lib/python3.11/site-packages/c.py:3) 3\n"
                 "main (/x/a.py:1);handle (/x/b.py:2) 1\n"
                 "main (/x/a.py:1);idle (/x/d.py:9) 4\n")
    total, inclusive, own = stacks.shares(f.read_text().splitlines())
    assert total == 8
    assert inclusive["main (/x/a.py:1)"] == 8 and inclusive["handle (/x/b.py:2)"] == 4
    assert own["parse (c.py:3)"] == 3 and own["handle (/x/b.py:2)"] == 1
    assert stacks.main([str(f), "--match", "handle"]) == 0
    out = capsys.readouterr().out
    assert " 50.0 %  handle (/x/b.py:2)" in out and " 12.5 %  handle (/x/b.py:2)" in out
