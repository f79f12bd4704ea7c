"""`mtsched check-config --role R` refuses what `mtsched R` refuses before it starts (its listen address and
TLS: shared/serving/listen.py start_problems); without --role it says so per serving role and exits 0."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = ["--set", "listen=0.0.0.0:8443"]  # the extender's address, off loopback, with no client CA


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MTSCHED_")}
    return subprocess.run([sys.executable, "-m", "controller.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, check=False, timeout=60)


@pytest.mark.parametrize(("args", "code", "says"), [
    (["check-config", "--role", "extender", *PUBLIC], 2, "the extender would not start"),
    (["extender", *PUBLIC], 2, "is not a loopback address"),  # the role itself, the twin of the line above
    (["check-config", *PUBLIC], 0, "note: as the extender this configuration would not start"),
    (["check-config", "--role", "extender"], 0, ""),  # loopback by default
    (["check-config", "--role", "watcher", *PUBLIC], 0, ""),  # serves no API: nothing to refuse
    (["check-config", "--role", "extender", *PUBLIC, "--set", "extenderAllowUnauthenticated=true"], 0, ""),
])
def test_check_config_judges_a_role_as_it_starts(args: list[str], code: int, says: str) -> None:
    proc = run(*args)
    assert proc.returncode == code, proc.stderr
    assert says in proc.stderr
    if not says:
        assert "would not start" not in proc.stderr
