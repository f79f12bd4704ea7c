"""A watcher whose first rebuild cannot reach the API server: not ready, saying why, and SIGTERM ends it
at once with exit 0. Before, its retry loop slept through SIGTERM and then started every task anyway.

A real `mtsched watcher` process against the suite's real redis-server; the API server's address is a
loopback port nobody listens on.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import threading
import uuid
from pathlib import Path

import aiohttp
import pytest

from controller.roles import run_watcher
from deploy.local.redis import RedisServer, free_port
from shared.config import load_config
from shared.serving.supervise import Stopped
from tests.kubeconfigs import token_kubeconfig
from tests.unit.test_role_waits_for_redis import _get, readiness_saying, role_process


def test_a_watcher_that_cannot_rebuild_is_not_ready_and_stops_on_sigterm(redis_server: RedisServer,
                                                                         tmp_path: Path) -> None:
    api = free_port()
    kubeconfig = token_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{api}")
    metrics, log = free_port(), tmp_path / "watcher.log"
    with role_process("watcher", log, f"redisUrl={redis_server.url}", f"kubeconfig={kubeconfig}",
                      f"keyPrefix=t{uuid.uuid4().hex[:8]}", f"metricsListen=127.0.0.1:{metrics}") as proc:
        ready = readiness_saying(proc, metrics, "initial rebuild of the ledger from the API: failed", log)
        assert ready[0] == 503, ready
        assert _get(f"http://127.0.0.1:{metrics}/healthz") == (200, "ok")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0, log.read_text()
        text = log.read_text()
        assert "stopped before the role could start" in text, text


async def test_sigterm_during_the_first_rebuilds_retries_ends_the_tasks_already_started(
        redis_server: RedisServer, tmp_path: Path) -> None:
    """By then the Redis tasks (mirror, probe) run under the role's supervisor: a stop must cancel them as the
    normal way out does (Supervisor.cancel, bounded), not leave them to the event loop's close, which waits
    without limit for a task whose cancel is lost (docs/runbooks.md "lost cancellations"). In-process."""
    kubeconfig = token_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{free_port()}")
    metrics = free_port()
    cfg = load_config(env={}, flags={"redisUrl": redis_server.url, "kubeconfig": str(kubeconfig),
                                     "keyPrefix": f"t{uuid.uuid4().hex[:8]}",
                                     "metricsListen": f"127.0.0.1:{metrics}"})
    stop = asyncio.Event()
    before = asyncio.all_tasks()
    role = asyncio.create_task(run_watcher(cfg, stop))
    async with aiohttp.ClientSession() as http:
        for _ in range(600):
            assert not role.done(), role
            try:
                async with http.get(f"http://127.0.0.1:{metrics}/readyz") as r:
                    if "initial rebuild of the ledger from the API: failed" in await r.text():
                        break
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the rebuild never failed")
    stop.set()
    with pytest.raises(Stopped):
        await asyncio.wait_for(role, 10)
    left = [t.get_name() for t in asyncio.all_tasks() - before if not t.done() and t is not role]
    assert left == [], left


def test_sigterm_while_the_first_rebuild_waits_on_an_api_server_that_never_answers(
        redis_server: RedisServer, tmp_path: Path) -> None:
    """An API server that takes the connection and never answers holds each call for its 30 s timeout: the
    stop must not wait for it (the kubelet's SIGKILL comes after the grace period). A real process."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    heard = threading.Event()

    def accept() -> None:
        with contextlib.suppress(OSError):  # closed at the end
            while True:
                held.append(listener.accept()[0])  # never answered
                heard.set()

    threading.Thread(target=accept, daemon=True).start()
    kubeconfig = token_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{listener.getsockname()[1]}")
    log = tmp_path / "watcher.log"
    try:
        with role_process("watcher", log, f"redisUrl={redis_server.url}", f"kubeconfig={kubeconfig}",
                          f"keyPrefix=t{uuid.uuid4().hex[:8]}", f"metricsListen=127.0.0.1:{free_port()}") as proc:
            assert heard.wait(60), log.read_text()  # the rebuild's first list waits
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=10) == 0, log.read_text()  # not the list's 30 s
            assert "stopped before the role could start" in log.read_text()
    finally:
        listener.close()
        for conn in held:
            conn.close()
