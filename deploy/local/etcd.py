"""etcd for the harness: its command line and the v3 JSON gateway calls the fault tests use."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from deploy.local.errors import ControlPlaneError

Json = dict[str, Any]


def etcd_argv(binary: Path, data_dir: Path, client_url: str, peer_port: int) -> list[str]:
    peer = f"http://127.0.0.1:{peer_port}"
    return [
        str(binary),
        "--name=harness",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client_url}",
        f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=harness={peer}",
        "--unsafe-no-fsync=true",  # test data: durability is irrelevant, speed is not
        "--log-level=warn",
    ]


def etcd_healthy(client_url: str) -> bool:
    with urllib.request.urlopen(f"{client_url}/health", timeout=2) as r:
        return bool(json.load(r).get("health") == "true")


def etcd_post(client_url: str, path: str, body: Json) -> Json:
    req = urllib.request.Request(
        client_url + path,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            out: Json = json.load(r)
            return out
    except urllib.error.HTTPError as e:
        raise ControlPlaneError(f"etcd {path}: HTTP {e.code}: {e.read()[:500]!r}") from e


def etcd_revision(client_url: str) -> int:
    """Current etcd revision (int64 values arrive as strings from the JSON gateway)."""
    status = etcd_post(client_url, "/v3/maintenance/status", {})
    return int(status["header"]["revision"])


def compact_etcd(client_url: str, revision: int) -> None:
    etcd_post(client_url, "/v3/kv/compaction", {"revision": str(revision), "physical": True})
