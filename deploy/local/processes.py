"""Child processes of the harness: each component in its own process group, logging to a file, and
polled until it answers (or exits, which fails at once with its log's last lines)."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from deploy.local.errors import ControlPlaneError

_handed_out: set[int] = set()

# What a server logs when the port it was given was taken meanwhile (Go and uvloop in lower case, Python's
# OSError as "Address already in use"): matched in lower case (port_taken).
ADDRESS_IN_USE = "address already in use"


def port_taken(log_text: str) -> bool:
    return ADDRESS_IN_USE in log_text.lower()


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A loopback port free now, below the kernel's ephemeral range and never the same twice in a process.

    Bind-to-0 picks from the ephemeral range, where every outgoing connection on this machine takes its
    source port: between our close and the server's bind, a client may take it ("bind: address already in
    use", once in CI for etcd). Below that range only listeners compete. Callers that start a server still
    retry on that error (``ADDRESS_IN_USE``): another process may pick the same port as we do.
    """
    top = min(_ephemeral_range()[0], 65536)
    rng = random.SystemRandom()
    for _ in range(200 if top > 10001 else 0):
        port = rng.randrange(10000, top)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    for _ in range(200):  # the kernel may give back a port it gave before (it was closed since)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port
    raise OSError(f"no loopback port free that this process has not handed out ({len(_handed_out)} so far)")


def default_workdir_parent() -> str | None:
    # tmpfs makes etcd and the apiserver noticeably faster to start and write.
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


def tail(path: Path, lines: int) -> str:
    try:
        data = path.read_text(errors="replace").splitlines()
    except OSError as e:
        return f"<cannot read {path}: {e}>"
    return "\n".join(data[-lines:])


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        if self.popen.poll() is not None:
            return
        # Each component runs in its own session, so its process group id is its pid.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(5)


def spawn(workdir: Path, name: str, argv: list[str]) -> Proc:
    """Start ``argv`` in ``workdir``, appending its output to ``{name}.log`` there."""
    log_path = workdir / f"{name}.log"
    with open(log_path, "ab") as log:
        log.write(f"\n# {time.strftime('%H:%M:%S')} {' '.join(argv)}\n".encode())
        log.flush()
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            start_new_session=True,  # own process group: stop() kills the whole group
        )
    return Proc(name, popen, log_path)


def wait_ready(proc: Proc, ready: Callable[[], bool], limit: float) -> None:
    """Poll ``ready`` (connection and TLS errors count as "not yet") until it holds, for ``limit`` seconds."""
    deadline = time.monotonic() + limit
    while True:
        if not proc.alive():
            raise ControlPlaneError(
                f"{proc.name} exited with {proc.popen.returncode}\n{tail(proc.log_path, 40)}"
            )
        with contextlib.suppress(OSError, ValueError, ssl.SSLError):
            if ready():
                return
        if time.monotonic() > deadline:
            raise ControlPlaneError(f"{proc.name} not ready after {limit}s\n{tail(proc.log_path, 40)}")
        time.sleep(0.1)
