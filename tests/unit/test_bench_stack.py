"""How the benchmark's kube-scheduler calls the extender (bench/stack.py, --extender-tls)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bench.stack import BenchStack


def stack(tmp_path: Path, tls: str, extenders: int = 1) -> BenchStack:
    (tmp_path / "client.crt").write_bytes(b"CERT")
    (tmp_path / "client.key").write_bytes(b"KEY")
    pki = SimpleNamespace(client_crt=tmp_path / "client.crt", client_key=tmp_path / "client.key")
    cp: Any = SimpleNamespace(pki=pki, workdir=tmp_path)
    return BenchStack(cp, "redis://127.0.0.1:1/0", extenders=extenders, extender_tls=tls)


@pytest.mark.parametrize(("tls", "extenders", "argv", "cert"), [
    # the chart: HTTPS, the extender asks no client certificate and kube-scheduler presents none
    ("chart", 1, ["--set", "extenderClientCAFile=", "--set", "extenderClientNames="], None),
    ("mutual", 1, [], (b"CERT", b"KEY")),
    ("http", 1, ["--set", "tlsCertFile=", "--set", "tlsKeyFile=", "--set", "extenderClientCAFile=",
                 "--set", "extenderClientNames=", "--set", "webhookClientCAFile=", "--set", "webhookClientNames="],
     None),
    # behind the balancer: mutual TLS whatever was asked
    ("chart", 3, [], (b"CERT", b"KEY")),
])
def test_how_kube_scheduler_calls_the_extender(tmp_path: Path, tls: str, extenders: int, argv: list[str],
                                               cert: tuple[bytes, bytes] | None) -> None:
    st = stack(tmp_path, tls, extenders)
    assert st.tls_argv("extender") == argv
    # the webhook as the chart deploys it by default: no client certificate asked (webhook.clientAuth)
    assert st.tls_argv("webhook") == ([] if tls == "mutual" else
                                      ["--set", "webhookClientCAFile=", "--set", "webhookClientNames="])
    assert st._scheduler_client_cert() == cert


def test_an_unknown_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="allowed: chart, mutual, http"):
        stack(tmp_path, "tls")


def test_plain_http_needs_one_replica(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="one extender replica"):
        stack(tmp_path, "http", extenders=3)._front("extender")
