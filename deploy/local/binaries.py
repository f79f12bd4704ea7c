"""The control plane's binaries: etcd, kube-apiserver and kube-scheduler, built once by
``build-binaries.sh`` from pinned Go modules into ``~/.cache/mthreads-harness``."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import IO

BUILD_SCRIPT = Path(__file__).with_name("build-binaries.sh")
BINARIES = ("etcd", "kube-apiserver", "kube-scheduler")
# Overrides the build script, e.g. for binaries built elsewhere.
BIN_DIR_ENV = "MTSCHED_K8S_BIN_DIR"


class BuildError(RuntimeError):
    """build-binaries.sh failed."""


def go_available() -> bool:
    return shutil.which("go") is not None


def ensure_binaries(progress: IO[str] | None = None) -> Path:
    """Return the directory holding etcd, kube-apiserver and kube-scheduler, building them if needed.

    Idempotent and instant once built. ``progress`` receives the script's stderr (progress lines);
    None captures it for the error message instead.
    """
    override = os.environ.get(BIN_DIR_ENV)
    if override:
        d = Path(override)
        missing = [b for b in BINARIES if not (d / b).is_file()]
        if missing:
            raise BuildError(f"{BIN_DIR_ENV}={d} lacks {', '.join(missing)}")
        return d
    proc = subprocess.run(
        ["bash", str(BUILD_SCRIPT)],
        stdout=subprocess.PIPE,
        stderr=progress if progress is not None else subprocess.PIPE,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        tail = "" if progress is not None else "\n".join((proc.stderr or "").splitlines()[-30:])
        raise BuildError(f"{BUILD_SCRIPT} exited {proc.returncode}\n{tail}")
    out = proc.stdout.strip().splitlines()
    if not out:
        raise BuildError(f"{BUILD_SCRIPT} printed no bin dir")
    return Path(out[-1])
