"""Red team, the chart's ledger-move check (validate.yaml): two Redis URLs that hami.ledgerAddress writes alike must
reach one ledger, as redis-py reads them (the roles' client, shared/store/redis_conn.py connect), or an upgrade
moving the ledger goes through with the scheduler running (two ledgers side by side). The helper took the ACL user
out up to the first "@" not behind a "/": a query option holding an "@" (`?client_name=a@b`, accepted for a Redis
without a password) was taken for a user, and every host before it dropped with it, so `redis://one?...a@b` and
`redis://two?...a@b` were one ledger."""

from __future__ import annotations

import shutil
from pathlib import Path

from redis.connection import parse_url

from tests.deploy._chart import CHART, run_helm, values_file

PROBE = """{{- range .Values.probeUrls }}
# {{ . }} {{ include "hami.ledgerAddress" . }}
{{- end }}
"""

URLS = [
    "redis://one?client_name=mtsched@a", "redis://two?client_name=mtsched@a",
    "redis://one:6379/0?client_name=mtsched@a", "redis://two/0?client_name=mtsched@a",
    "redis://one#x@two", "redis://two#x@one",
    "redis://u@one/0", "redis://u@two/0", "redis://one", "redis://two:6379/0", "redis://one/1", "redis://two/1",
    "rediss://one", "rediss://one:6379/0", "redis://[::1]", "redis://[::1]:6379/0", "redis://one/0?db=1",
    "redis://one?socket_timeout=3", "redis://one/?db=0", "redis://one:6379/0",
]


def _addresses(helm: Path, tmp_path: Path) -> dict[str, str]:
    chart = tmp_path / "hami"
    shutil.copytree(CHART, chart)
    (chart / "templates" / "zz-probe.yaml").write_text(PROBE)
    with values_file({"probeUrls": URLS}) as vf:
        out = run_helm(helm, ["template", "hami", str(chart), "--show-only", "templates/zz-probe.yaml",
                              "-f", str(vf)]).stdout
    pairs = [line[2:].split(" ", 1) for line in out.splitlines() if line.startswith("# ") and "://" in line]
    return {url: address for url, address in pairs}


def _reached(url: str) -> tuple[object, ...]:
    """What redis-py connects to for `url`: scheme, host, port and database (its defaults: 6379, 0)."""
    kw = parse_url(url)  # type: ignore[no-untyped-call]
    return url.split("://")[0], str(kw["host"]).lower(), kw.get("port", 6379), kw.get("db", 0)


def test_redteam_one_ledger_address_is_one_redis_and_database(helm: Path, tmp_path: Path) -> None:
    addresses = _addresses(helm, tmp_path)
    assert set(addresses) == set(URLS)
    for a in URLS:
        for b in URLS:
            if addresses[a] == addresses[b]:
                assert _reached(a) == _reached(b), f"{a} and {b} are one ledger to the chart ({addresses[a]})"
    # and the same Redis written another way is one address (what the helper is for)
    for a, b in [("redis://one", "redis://one:6379/0"), ("redis://u@one/0", "redis://one"),
                 ("rediss://one", "rediss://one:6379/0"), ("redis://[::1]", "redis://[::1]:6379/0"),
                 ("redis://one?socket_timeout=3", "redis://one"),
                 ("redis://one?client_name=mtsched@a", "redis://one:6379/0?client_name=mtsched@a")]:
        assert addresses[a] == addresses[b], (a, b)
