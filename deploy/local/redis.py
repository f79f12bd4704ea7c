"""A throwaway real redis-server for tests, benchmarks and the quick start."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis


def terminate(proc: subprocess.Popen[bytes] | None, timeout: float = 10.0) -> None:
    """Stop a child politely, then for good."""
    if proc and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """redis-server on 127.0.0.1 with no persistence; restartable on the same port."""

    def __init__(self, port: int | None = None, workdir: str | None = None, binary: str | None = None):
        self.port = port or free_port()
        self._own_dir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="mtsched-redis-"))
        self.binary = binary or shutil.which("redis-server") or "redis-server"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        if not shutil.which(self.binary):
            raise RuntimeError("redis-server not found: install it (Debian package redis-server)")
        log = open(self.workdir / "redis.log", "ab")  # noqa: SIM115 - kept open for the child's lifetime
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.workdir), "--protected-mode", "no"],
            stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if redis.Redis(port=self.port, socket_timeout=0.5).ping():
                    return self
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server did not start on port {self.port}: see {self.workdir / 'redis.log'}")

    def stop(self) -> None:
        terminate(self.proc, 5)
        self.proc = None

    def cleanup(self) -> None:
        """Stop and remove the working directory this server created."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def restart(self) -> None:
        """Stop and start again on the same port: all data and loaded scripts are gone."""
        self.stop()
        self.start()
