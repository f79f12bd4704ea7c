"""Helpers for the chart tests (tests/deploy) and the server-side dry-run (tests/e2e/test_helm_dryrun.py).

helm is built once by deploy/helm-tools/build-helm.sh from the pinned Go module into
~/.cache/mthreads-harness/helm-<version>/. Tests skip only when Go is missing *and* helm is not
built yet; a failing build fails them.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "hami"
BUILD_HELM = ROOT / "deploy" / "helm-tools" / "build-helm.sh"
RENDER_SH = ROOT / "deploy" / "manifests" / "render.sh"
MANIFEST = ROOT / "deploy" / "manifests" / "hami.yaml"

Json = dict[str, Any]

# Kinds from CRDs the local control plane does not have: they cannot be validated server-side.
CRD_KINDS = {("cert-manager.io/v1", "Issuer"), ("cert-manager.io/v1", "Certificate"),
             ("monitoring.coreos.com/v1", "PrometheusRule")}

# A throwaway CA bundle for tls.mode=external cases (only its base64 shape matters to the chart).
_FAKE_CA = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").decode()


@dataclass(frozen=True)
class Case:
    """A values combination: a values file (dict) and/or --set flags."""

    values: Mapping[str, Any] = field(default_factory=dict)
    sets: tuple[str, ...] = ()
    memory: tuple[int, ...] = (96,)  # memoryPerCard that must reach the running config
    release: str = "hami"
    namespace: str = "kube-system"


def _mt(**kw: Any) -> Json:
    return {"devices": {"mthreads": kw}}


CASES: dict[str, Case] = {
    "defaults": Case(),
    # The seed documents' one-liner (HAMi's current value names).
    "seed-oneliner": Case(sets=("scheduler.kubeScheduler.image.tag=v1.30.4", "devices.mthreads.enabled=true")),
    "s5000": Case(_mt(enabled=True, memoryPerCard=[160]), memory=(160,)),
    "mixed": Case(_mt(enabled=True, memoryPerCard=[96, 160]), memory=(96, 160)),
    "legacy-scalar": Case(_mt(memoryPerCard=160), memory=(160,)),
    "set-list": Case(sets=("devices.mthreads.memoryPerCard={96,160}",), memory=(96, 160)),
    "external-redis": Case({"redis": {"external": {
        "url": "rediss://redis.example:6380/1", "existingSecret": "mt-redis", "passwordKey": "pw",
        "username": "mtsched"}}}),
    "external-sentinel": Case({"redis": {"external": {
        "url": "redis+sentinel://sentinel-0.redis:26379,sentinel-1.redis:26379/mymaster/0",
        "existingSecret": "mt-redis"}}}),
    "external-cluster": Case(sets=("redis.external.url=redis+cluster://redis-cluster-0.redis:6379",)),
    # TLS with a private CA, an ACL user and its password (tests/deploy/test_trust_chart.py)
    "external-redis-tls": Case({"redis": {"external": {
        "url": "rediss://redis.example:6380/0", "existingSecret": "mt-redis", "username": "mtsched",
        "tls": {"caSecret": "mt-redis-ca"}}}}),
    "redis-no-auth": Case(sets=("redis.auth.enabled=false",)),
    # the webhook requires the API server's client certificate (tests/deploy/test_trust_chart.py)
    "webhook-client-auth": Case({"webhook": {"clientAuth": {
        "caSecret": "apiserver-client-ca", "caKey": "client-ca.pem",
        "allowedNames": ["kube-apiserver", "apiserver.example.com"]}}}),
    "network-policy": Case({"networkPolicy": {"enabled": True, "metricsFrom": [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
         "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]},
        "mtsched": {"metricsBindAddress": "::"}}),
    "cert-manager": Case({"tls": {"mode": "certManager"}}),
    "cert-manager-issuer": Case({"tls": {"mode": "certManager", "certManager": {
        "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}}}}),
    # kube-scheduler calls its extender sidecar over HTTPS, checking the chart's certificate
    "extender-https": Case(sets=("scheduler.extender.scheme=https",)),
    "external-tls": Case({"tls": {"mode": "external", "external": {"secretName": "my-tls", "caBundle": _FAKE_CA}}}),
    # A HAMi-era values file: legacy imageTag, HAMi's cert-manager switch, Ignore, no whitelist.
    "hami-legacy": Case({"scheduler": {
        "certManager": {"enabled": True},
        "kubeScheduler": {"imageTag": "v1.30.4"},
        "admissionWebhook": {"failurePolicy": "Ignore", "whitelistNamespaces": None}}}),
    "disabled": Case(_mt(enabled=False)),
    # the Grafana dashboard ConfigMap and the PrometheusRule (tests/deploy/test_monitoring.py)
    "monitoring": Case({"monitoring": {
        "dashboard": {"enabled": True, "annotations": {"grafana_folder": "GPU"}},
        "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"},
                           "runbookUrl": "https://git.example/mtsched/blob/main/docs/runbooks.md"}}}),
    # the webhook without its quota check: no RBAC, no token (tests/deploy/test_chart.py)
    "no-quota-check": Case({"mtsched": {"quotaCheck": False}}),
    "node-agent": Case({"nodeAgent": {"enabled": True, "intervalSeconds": 10}}),
    "replicas-3": Case({"scheduler": {"replicas": 3}, "webhook": {"replicas": 3}, "watcher": {"replicas": 3}}),
    "replicas-1": Case({"scheduler": {"replicas": 1}, "webhook": {"replicas": 1}, "watcher": {"replicas": 1}}),
    "custom": Case(
        {"devices": {"mthreads": {"memoryPerCard": [160], "resourceCountName": "example.com/vgpu"}},
         "schedulerName": "gpu-scheduler",
         "scheduler": {"defaultSchedulerPolicy": {"nodeSchedulerPolicy": "spread", "gpuSchedulerPolicy": "binpack"},
                       "filterTopK": 5,
                       "percentageOfNodesToScore": 0,
                       "admissionWebhook": {
                           "namespaceSelector": {"matchLabels": {"gpu": "yes"}, "matchExpressions": [
                               {"key": "team", "operator": "In", "values": ["ml"]}]}}},
         "global": {"imageRegistry": "mirror.example:5000", "imagePullSecrets": ["regcred"],
                    "labels": {"cost-center": "gpu"}, "annotations": {"owner": "platform"}},
         "mtsched": {"logLevel": "debug", "logFormat": "text", "metricsPort": 9400}},
        memory=(160,), release="gpu", namespace="hami-system"),
}


# ------------------------------------------------------------------------------------------ helm
def _go_available() -> bool:
    return shutil.which("go") is not None


def built_tool(pytestconfig: pytest.Config, script: Path) -> tuple[int, Path | None]:
    """Run a build script that prints the built binary's path last (deploy/helm-tools/build-helm.sh,
    deploy/local/build-hamicompat.sh): its exit status and that path when it is a file."""
    capman = pytestconfig.pluginmanager.getplugin("capturemanager")
    uncaptured = capman.global_and_fixture_disabled() if capman else contextlib.nullcontext()
    with uncaptured:  # a cold build takes minutes: show its progress lines
        proc = subprocess.run([str(script)], stdout=subprocess.PIPE, stderr=None, text=True, check=False)
    path = Path(proc.stdout.strip().splitlines()[-1]) if proc.stdout.strip() else None
    return proc.returncode, path if path is not None and path.is_file() else None


def helm_binary(pytestconfig: pytest.Config) -> Path:
    """Build (first run) or reuse helm; skip if it cannot be built for lack of Go, fail otherwise."""
    rc, path = built_tool(pytestconfig, BUILD_HELM)
    if rc == 0 and path:
        return path
    if not _go_available():
        pytest.skip("helm is not built and Go (1.26+) is not installed: install Go and run "
                    "deploy/helm-tools/build-helm.sh")
    pytest.fail(f"building helm with {BUILD_HELM} failed (exit {rc})", pytrace=False)


def helm_env(home: Path) -> dict[str, str]:
    """helm with its cache/config/data under `home`, never the user's."""
    env = dict(os.environ)
    for var, sub in (("HELM_CACHE_HOME", "cache"), ("HELM_CONFIG_HOME", "config"), ("HELM_DATA_HOME", "data")):
        env[var] = str(home / sub)
    env.pop("KUBECONFIG", None)
    return env


def run_helm(helm: Path, args: Sequence[str], *, check: bool = True,
             env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="helm-home-") as home:
        proc = subprocess.run([str(helm), *args], capture_output=True, text=True, check=False,
                              env=dict(env) if env is not None else helm_env(Path(home)), timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args[:2])} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc


@contextlib.contextmanager
def values_file(values: Mapping[str, Any]) -> Iterator[Path]:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="values-", delete=False) as f:
        yaml.safe_dump(dict(values), f, sort_keys=False)
    try:
        yield Path(f.name)
    finally:
        os.unlink(f.name)


def case_args(case: Case, values_path: Path | None) -> list[str]:
    args = ["--namespace", case.namespace]
    if values_path is not None:
        args += ["-f", str(values_path)]
    for s in case.sets:
        args += ["--set", s]
    return args


def template(helm: Path, case: Case, *extra: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    with values_file(case.values) as vf:
        return run_helm(helm, ["template", case.release, str(CHART), *case_args(case, vf), *extra], check=check)


def objects(text: str) -> list[Json]:
    return [d for d in yaml.safe_load_all(text) if d]


# --------------------------------------------------------------------------------- object access
def find(objs: Sequence[Json], kind: str, name: str | None = None) -> list[Json]:
    return [o for o in objs if o.get("kind") == kind and (name is None or o["metadata"]["name"] == name)]


def one(objs: Sequence[Json], kind: str, name: str) -> Json:
    found = find(objs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}: " + ", ".join(
        f"{o['kind']}/{o['metadata']['name']}" for o in objs)
    return found[0]


def container(deploy: Json, name: str) -> Json:
    for c in deploy["spec"]["template"]["spec"]["containers"]:
        if c["name"] == name:
            return c
    raise AssertionError(f"{deploy['metadata']['name']} has no container {name}")


def embedded(objs: Sequence[Json], configmap: str, key: str) -> Json:
    cm = one(objs, "ConfigMap", configmap)
    data = yaml.safe_load(cm["data"][key])
    assert isinstance(data, dict)
    return data


def check_config(config_yaml: str, env: Mapping[str, str] | None = None) -> Json:
    """`mtsched check-config` on a rendered config.yaml; returns its JSON output (camelCase keys)."""
    import json

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="mtsched-config-", delete=False) as f:
        f.write(config_yaml)
    try:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("MTSCHED_")}
        clean.update(env or {})
        proc = subprocess.run([sys.executable, "-m", "controller.cli", "check-config", "--config", f.name],
                              capture_output=True, text=True, cwd=ROOT, env=clean, check=False, timeout=60)
    finally:
        os.unlink(f.name)
    assert proc.returncode == 0, f"mtsched check-config rejected the rendered config:\n{proc.stderr}"
    raw: Json = json.loads(proc.stdout)
    # The file's camelCase keys (older releases printed snake_case field names).
    out: Json = {}
    for k, v in raw.items():
        head, *rest = k.split("_")
        out["pendingTTLSeconds" if k == "pending_ttl_seconds" else head + "".join(p.capitalize() for p in rest)] = v
    return out
