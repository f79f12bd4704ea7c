"""How the benchmark's kube-scheduler calls the extender (bench/stack.py, --extender-tls)."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bench.stack import CHART_DEFAULT, EXTENDER_TLS, BenchStack


def stack(tmp_path: Path, tls: str, extenders: int = 1) -> BenchStack:
    (tmp_path / "client.crt").write_bytes(b"CERT")
    (tmp_path / "client.key").write_bytes(b"KEY")
    pki = SimpleNamespace(client_crt=tmp_path / "client.crt", client_key=tmp_path / "client.key")
    cp: Any = SimpleNamespace(pki=pki, workdir=tmp_path)
    return BenchStack(cp, "redis://127.0.0.1:1/0", extenders=extenders, extender_tls=tls)


@pytest.mark.parametrize(("tls", "extenders", "argv", "cert"), [
    # the chart with scheme https: the extender asks no client certificate and kube-scheduler presents none
    ("https", 1, ["--set", "extenderClientCAFile=", "--set", "extenderClientNames="], None),
    ("mutual", 1, [], (b"CERT", b"KEY")),
    # the chart's default (scheme http): no certificate at all
    *[(mode, 1, ["--set", "tlsCertFile=", "--set", "tlsKeyFile=", "--set", "extenderClientCAFile=",
                 "--set", "extenderClientNames=", "--set", "webhookClientCAFile=", "--set", "webhookClientNames="],
       None) for mode in ("http", "chart")],
    # behind the balancer: mutual TLS whatever was asked
    *[(mode, 3, [], (b"CERT", b"KEY")) for mode in ("chart", "https")],
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
    with pytest.raises(ValueError, match="allowed: chart, http, https, mutual"):
        stack(tmp_path, "tls")


def test_plain_http_is_the_sidecar_only(tmp_path: Path) -> None:
    """Several replicas are reached through the harness's balancer (mutual TLS), whatever the mode."""
    st = stack(tmp_path, "chart", extenders=1)
    st.roles = [SimpleNamespace(kind="extender", port=1234)]  # type: ignore[list-item]
    assert st._front("extender") == "http://127.0.0.1:1234"
    several = stack(tmp_path, "chart", extenders=3)
    several.balancers = {"extender": (None, 4321)}  # type: ignore[dict-item]
    assert several._front("extender") == "https://127.0.0.1:4321"


def test_chart_is_the_charts_default_scheme(tmp_path: Path) -> None:
    """`chart` follows scheduler.extender.scheme's default in the chart's values."""
    import yaml

    values = yaml.safe_load((Path(__file__).parents[2] / "deploy/helm/hami/values.yaml").read_text())
    assert stack(tmp_path, "chart").extender_tls == values["scheduler"]["extender"]["scheme"]


def test_the_benchmark_docs_list_every_mode() -> None:
    """docs/benchmarks.md's `--extender-tls` row names the modes bench/stack.py accepts, in its order."""
    doc = (Path(__file__).parents[2] / "docs/benchmarks.md").read_text()
    (row,) = [line for line in doc.splitlines() if line.startswith("| `--extender-tls ")]
    modes = re.match(r"\| `--extender-tls ([a-z\\|]+)`", row)
    assert modes is not None and modes.group(1).split("\\|") == list(EXTENDER_TLS), row
    assert f"`chart` (the default): what the chart deploys by default (`scheduler.extender.scheme`), today " \
           f"`{CHART_DEFAULT}`" in row


@pytest.mark.parametrize(("given", "recorded"), [("chart", CHART_DEFAULT), ("http", "http"), ("https", "https"),
                                                 ("mutual", "mutual")])
def test_a_run_records_the_mode_it_measured(given: str, recorded: str) -> None:
    """`chart` meant https before 2026-12-03 and http since: a result file records the concrete mode beside
    the option as given, so runs from either side of the change can be told apart."""
    import argparse

    from bench.load.cli import run_config

    config = run_config(argparse.Namespace(extender_tls=given))
    assert config["extender_tls"] == given and config["extender_tls_mode"] == recorded
