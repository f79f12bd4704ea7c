"""Red team, pytest-timeout (pyproject.toml `timeout`): an async test it ends must not run on in the session's loop
during the later tests (tests/_orphans.py). Reproducer: a test polling forever, timed out after 1 s; the next test
saw it still polling (its task pending in the loop it shares). And a timeout whose exception lands in another task
(one blocked in a sync call) must not leave the test waiting for good: the run hung with no alarm left."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CASE = '''
import asyncio
import time

import pytest

POLLS = [0]


@pytest.mark.timeout(1)
async def test_hangs_polling():
    while True:  # a wait on a condition that never comes, without a deadline
        await asyncio.sleep(0.02)
        POLLS[0] += 1


async def test_later():
    before = POLLS[0]
    for _ in range(10):
        await asyncio.sleep(0.05)
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert POLLS[0] == before and not others, f"the timed-out test runs on: {others}"


async def busy():
    while True:
        time.sleep(0.3)  # a sync call the loop waits on: most alarms land in this frame
        await asyncio.sleep(0)


@pytest.mark.timeout(1)
async def test_hangs_while_another_task_blocks():
    task = asyncio.create_task(busy())
    try:
        await asyncio.Event().wait()
    finally:
        task.cancel()
'''


def test_redteam_a_timed_out_test_ends_and_does_not_run_on_in_the_session_loop(tmp_path: Path) -> None:
    (tmp_path / "test_case.py").write_text(CASE)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests._orphans", "-p", "no:cacheprovider",
         "-o", "asyncio_mode=auto", "-o", "asyncio_default_test_loop_scope=session",
         "-o", "asyncio_default_fixture_loop_scope=session", "-o", "timeout_again=1", "--rootdir", str(tmp_path),
         str(tmp_path)],
        cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
        timeout=60, check=False)  # (bounds the hang this test is about)
    out = proc.stdout + proc.stderr
    assert "Timeout (>1.0s)" in out, out[-3000:]
    assert "2 failed, 1 passed" in out, out[-3000:]
