"""A throwaway standalone redis-server on 127.0.0.1 without persistence, and the helpers the Sentinel
and Cluster setups (deploy/local/redis_ha.py) share with it."""

from __future__ import annotations

import functools
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import redis

from deploy.local.processes import free_port


def terminate(proc: subprocess.Popen[bytes] | None, timeout: float = 10.0) -> None:
    """Stop a child politely, then for good."""
    if proc and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def kill(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL a child by its pid (a crash: no shutdown, no goodbye to clients) and reap it."""
    if proc and proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def wait_until(check: Callable[[], bool], within: float, what: str, step: float = 0.05) -> None:
    """Poll `check` (errors count as "not yet") until it holds; the limit only bounds a hang."""
    deadline = time.monotonic() + within
    last: Exception | None = None
    while True:
        try:
            if check():
                return
        except (redis.RedisError, OSError) as e:
            last = e
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not reached within {within}s" + (f" (last error: {last})" if last else ""))
        time.sleep(step)


def cmd(client: redis.Redis, *args: Any) -> Any:
    return client.execute_command(*args)  # type: ignore[no-untyped-call]


def auth(password: str | None) -> str:
    return f":{quote(password, safe='')}@" if password else ""


def new_password() -> str:
    """A random password for a throwaway server (URL-safe: it goes into URLs as it is)."""
    return secrets.token_urlsafe(24)


@dataclass(frozen=True)
class ServerTLS:
    """TLS for a RedisServer: it serves only TLS (no plain port), with this certificate, and checks
    client certificates against `ca_file` when `auth_clients`. `client_cert_file`/`client_key_file`:
    the harness's own identity for its pings and clients (needed with `auth_clients`)."""

    cert_file: Path
    key_file: Path
    ca_file: Path
    auth_clients: bool = False
    client_cert_file: Path | None = None
    client_key_file: Path | None = None

    def args(self, port: int) -> list[str]:
        return ["--port", "0", "--tls-port", str(port), "--tls-cert-file", str(self.cert_file),
                "--tls-key-file", str(self.key_file), "--tls-ca-cert-file", str(self.ca_file),
                "--tls-auth-clients", "yes" if self.auth_clients else "no"]

    def client_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"ssl": True, "ssl_ca_certs": str(self.ca_file)}
        if self.client_cert_file and self.client_key_file:
            kw.update(ssl_certfile=str(self.client_cert_file), ssl_keyfile=str(self.client_key_file))
        return kw


@functools.cache
def server_major(binary: str = "") -> int:
    """The major version of the redis-server on the PATH (or `binary`), from `--version`; 0 when unknown."""
    found = binary or shutil.which("redis-server") or ""
    try:
        out = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    m = re.search(r"v=(\d+)\.", out)
    return int(m.group(1)) if m else 0


class RedisServer:
    """redis-server on 127.0.0.1 with no persistence; restartable on the same port.

    `args` are extra redis-server options (e.g. --replicaof, --cluster-enabled); `password` sets
    requirepass and masterauth (a replica, or a master demoted by a failover, authenticates with it);
    `tls` makes it serve TLS only on its port. Protected mode stays on (redis-server's default): it
    only refuses clients from other addresses, and this server listens on loopback.
    """

    def __init__(self, port: int | None = None, workdir: str | None = None, binary: str | None = None,
                 password: str | None = None, args: Sequence[str] = (), tls: ServerTLS | None = None):
        self.port = port or free_port()
        self._own_dir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="mtsched-redis-"))
        self.binary = binary or shutil.which("redis-server") or "redis-server"
        self.password = password
        self.args = list(args)
        self.tls = tls
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Everything a test client needs: the password, and with TLS the CA and client certificate."""
        if self.tls is None:
            return f"redis://{auth(self.password)}127.0.0.1:{self.port}/0"
        query = {k: v for k, v in self.tls.client_kwargs().items() if k != "ssl"}
        return f"rediss://{auth(self.password)}127.0.0.1:{self.port}/0?{urlencode(query)}"

    def client(self, timeout: float = 2.0) -> redis.Redis:
        """A synchronous client for the harness itself (the caller closes it)."""
        return redis.Redis(port=self.port, password=self.password, socket_timeout=timeout,
                           socket_connect_timeout=timeout, decode_responses=True,
                           **(self.tls.client_kwargs() if self.tls else {}))

    def start(self) -> RedisServer:
        if not shutil.which(self.binary):
            raise RuntimeError("redis-server not found: install it (Debian package redis-server)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        auth = ["--requirepass", self.password, "--masterauth", self.password] if self.password else []
        ports = self.tls.args(self.port) if self.tls else ["--port", str(self.port)]
        with open(self.workdir / "redis.log", "ab") as log:  # the child keeps its own copy
            self.proc = subprocess.Popen(
                [self.binary, *ports, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", str(self.workdir), *auth, *self.args],
                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                with self.client(timeout=0.5) as r:
                    if r.ping():
                        return self
            except redis.ConnectionError:
                time.sleep(0.05)
        tail = (self.workdir / "redis.log").read_text(errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(f"redis-server did not start on port {self.port}: {' | '.join(tail)} "
                           f"(see {self.workdir / 'redis.log'})")

    def stop(self) -> None:
        terminate(self.proc, 5)
        self.proc = None

    def kill(self) -> None:
        """Crash it (SIGKILL by pid): without persistence its data is gone when it comes back."""
        kill(self.proc)
        self.proc = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def empty(self) -> RedisServer:
        """Running (started again if a test stopped or crashed it) and holding no data: a clean start for
        the next user of a server shared by many tests."""
        if not self.running:
            self.start()
        with self.client() as r:
            r.flushall()
        return self

    def cleanup(self) -> None:
        """Stop and remove the working directory this server created."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def restart(self) -> None:
        """Stop and start again on the same port: all data and loaded scripts are gone."""
        self.stop()
        self.start()
