"""The harness's ports: below the kernel's ephemeral range (where clients take their source ports, so a
port handed out stays free until its server binds it), free when handed out, and never handed out twice."""

from __future__ import annotations

import random
import socket
import sys
from pathlib import Path

import pytest

from deploy.local import processes
from deploy.local.processes import Proc, free_port, port_taken, spawn


def test_ports_are_below_the_ephemeral_range_and_never_repeat() -> None:
    low, _ = processes._ephemeral_range()
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    if low < 10300:  # e.g. "1024 65535": no room below it, so bind-to-0 (the ports still never repeat)
        pytest.skip(f"this machine's ephemeral range starts at {low}")
    assert all(10000 <= p < low for p in ports)


def test_with_no_room_below_the_ephemeral_range_ports_come_from_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(processes, "_ephemeral_range", lambda: (1024, 65535))
    ports = [free_port() for _ in range(20)]
    assert len(set(ports)) == len(ports)


def test_the_kernel_giving_a_port_back_twice_is_not_handed_out_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    # bind-to-0 may return a port it returned before (closed since): the test above failed so, once
    given = iter([40001, 40001, 40002])

    class Kernel:
        def __init__(self, *_: object) -> None: ...
        def __enter__(self) -> Kernel:
            return self
        def __exit__(self, *_: object) -> None: ...
        def bind(self, _: object) -> None: ...
        def getsockname(self) -> tuple[str, int]:
            return ("127.0.0.1", next(given))

    monkeypatch.setattr(processes, "_ephemeral_range", lambda: (1024, 65535))
    monkeypatch.setattr(processes, "_handed_out", set())
    monkeypatch.setattr(processes.socket, "socket", Kernel)
    assert [free_port(), free_port()] == [40001, 40002]


def test_a_port_taken_by_a_listener_is_not_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        busy = taken.getsockname()[1]
        taken.listen()
        picks = iter([busy, busy, busy])

        class Rigged(random.SystemRandom):
            def randrange(self, *args: int) -> int:  # type: ignore[override]
                return next(picks, 0) or super().randrange(*args)

        monkeypatch.setattr("deploy.local.processes.random.SystemRandom", Rigged)
        monkeypatch.setattr(processes, "_ephemeral_range", lambda: (65536, 65536))
        assert free_port() != busy


def test_the_range_falls_back_when_unreadable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(processes, "Path", lambda _: Path("/nonexistent/ip_local_port_range"))
    assert processes._ephemeral_range() == (32768, 60999)


@pytest.mark.parametrize("text", ["bind: address already in use", "OSError: [Errno 98] Address already in use"])
def test_the_retry_knows_a_taken_port_in_go_and_python_spelling(text: str) -> None:
    assert port_taken(f"some line\n{text}\n")
    assert not port_taken("listen tcp 127.0.0.1:2379: bind: permission denied")


def test_a_python_server_refused_its_port_logs_what_the_retry_looks_for(tmp_path: Path) -> None:
    # the retry in ControlPlane/Stack keys on the text of the error
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = f"import socket; socket.socket().bind(('127.0.0.1', {port}))"
        proc: Proc = spawn(tmp_path, "clash", [sys.executable, "-c", code])
        proc.popen.wait(30)
    assert port_taken(proc.log_path.read_text())
