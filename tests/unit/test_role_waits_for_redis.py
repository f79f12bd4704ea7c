"""A role started while Redis is unreachable: its probes are answered (alive, not ready, and why) and SIGTERM
ends it at once with exit 0. Before, it served no port until Redis answered, so the kubelet's liveness probe
restarted it over and over, and SIGTERM waited for Redis (the kubelet's SIGKILL after the grace period).

Real `mtsched <role>` processes; the Redis address is a loopback port nobody listens on.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.local.redis import free_port

pytestmark = pytest.mark.parametrize("role", ["extender", "webhook", "watcher"])


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode()


@contextlib.contextmanager
def role_process(role: str, log_path: Path, *settings: str) -> Iterator[subprocess.Popen[bytes]]:
    """A real `mtsched <role>` process (text logs to `log_path`, each of `settings` a `--set`), killed at the
    end if it still runs."""
    with log_path.open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "controller.cli", role, "--log-format", "text",
                                 *(arg for kv in settings for arg in ("--set", kv))],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def readiness_saying(proc: subprocess.Popen[bytes], metrics: int, text: str, log_path: Path) -> tuple[int, str]:
    """The role's first /readyz answer that contains `text` (within 60 s, the process still running)."""
    deadline = time.monotonic() + 60
    ready = (0, "")
    while text not in ready[1]:
        assert proc.poll() is None and time.monotonic() < deadline, (log_path.read_text(), ready)
        try:
            ready = _get(f"http://127.0.0.1:{metrics}/readyz")
        except OSError:
            time.sleep(0.1)
    return ready


def test_a_role_waiting_for_redis_answers_its_probes_and_stops_on_sigterm(role: str, tmp_path: Path) -> None:
    redis_port, metrics, log = free_port(), free_port(), tmp_path / "role.log"
    with role_process(role, log, f"redisUrl=redis://127.0.0.1:{redis_port}/0", f"listen=127.0.0.1:{free_port()}",
                      f"metricsListen=127.0.0.1:{metrics}", "quotaCheck=false") as proc:
        ready = readiness_saying(proc, metrics, "not reachable at", log)  # the first failed try is in the reason
        assert ready[0] == 503 and f"Redis: not reachable at redis://127.0.0.1:{redis_port}/0" in ready[1], ready
        assert _get(f"http://127.0.0.1:{metrics}/healthz") == (200, "ok")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()
        assert "stopped before the role could start" in log.read_text()
