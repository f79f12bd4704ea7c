"""The chart rendered for an e2e stack, as deploy/manifests/render.sh renders it, with extra `--set`s."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.deploy._chart import helm_binary, run_helm

CHART = Path(__file__).resolve().parents[2] / "deploy/helm/hami"


def rendered(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory, name: str,
             *sets: str) -> Path:
    """The chart (external TLS, the Redis password from its Secret, and `sets`) written to a file `name`."""
    args = ["template", "hami", str(CHART), "--namespace", "kube-system", "--kube-version", "v1.36.3",
            "--set", "tls.mode=external", "--set", "redis.auth.existingSecret=hami-redis-auth"]
    for s in sets:
        args += ["--set", s]
    path = tmp_path_factory.mktemp("chart") / name
    path.write_text(run_helm(helm_binary(pytestconfig), args).stdout)
    return path
