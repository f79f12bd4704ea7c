"""kube-scheduler's setup: the extender entry, the KubeSchedulerConfiguration and the command line."""

from __future__ import annotations

import base64
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Json = dict[str, Any]


@dataclass(frozen=True)
class ExtenderSpec:
    """One scheduler extender (KubeSchedulerConfiguration v1 ``extenders[]``).

    ``ca_pem`` None means the harness CA (the serving cert from ``ControlPlane.pki`` is signed by it).
    A verb set to None is left out of the config (that call is then never made).
    """

    url_prefix: str
    ca_pem: bytes | None = None
    filter_verb: str | None = "filter"
    prioritize_verb: str | None = "prioritize"
    bind_verb: str | None = "bind"
    preempt_verb: str | None = "preempt"
    weight: int = 1
    node_cache_capable: bool = True
    http_timeout: str = "30s"
    ignorable: bool = False
    # (resource name, ignoredByScheduler). Non-empty => the extender is only called for pods that
    # request one of these in requests/limits of containers or initContainers: the chart's, card units too
    # (a pod asking them without vgpu is the extender's to refuse, not kube-scheduler's to bind).
    managed_resources: tuple[tuple[str, bool], ...] = (("mthreads.com/vgpu", True), ("mthreads.com/sgpu-memory", False),
                                                       ("mthreads.com/sgpu-core", False))
    # A client certificate kube-scheduler presents to the extender (mTLS), PEM; None: none.
    client_cert_pem: bytes | None = None
    client_key_pem: bytes | None = None

    def to_config(self, default_ca_pem: bytes) -> Json:
        cfg: Json = {
            "urlPrefix": self.url_prefix,
            "weight": self.weight,
            "nodeCacheCapable": self.node_cache_capable,
            "httpTimeout": self.http_timeout,
            "ignorable": self.ignorable,
            "enableHTTPS": self.url_prefix.startswith("https://"),
        }
        for key, verb in (
            ("filterVerb", self.filter_verb),
            ("prioritizeVerb", self.prioritize_verb),
            ("bindVerb", self.bind_verb),
            ("preemptVerb", self.preempt_verb),
        ):
            if verb:
                cfg[key] = verb
        if cfg["enableHTTPS"]:
            ca = self.ca_pem if self.ca_pem is not None else default_ca_pem
            # []byte fields are base64 in the config, as in Go's encoding/json.
            cfg["tlsConfig"] = {"insecure": False, "caData": base64.b64encode(ca).decode()}
            if self.client_cert_pem and self.client_key_pem:
                cfg["tlsConfig"]["certData"] = base64.b64encode(self.client_cert_pem).decode()
                cfg["tlsConfig"]["keyData"] = base64.b64encode(self.client_key_pem).decode()
        if self.managed_resources:
            cfg["managedResources"] = [
                {"name": n, "ignoredByScheduler": ignored} for n, ignored in self.managed_resources
            ]
        return cfg


@dataclass
class SchedulerSetup:
    extender: ExtenderSpec | None
    scheduler_name: str
    extra_profiles: tuple[Json, ...]
    extra_args: tuple[str, ...]
    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    kubeconfig: Path | None = None  # None: the admin kubeconfig


def scheduler_config(setup: SchedulerSetup, kubeconfig: Path, ca_pem: bytes) -> Json:
    """The KubeSchedulerConfiguration: profiles default-scheduler + ``setup.scheduler_name`` (+ extras).

    ``kubeconfig`` is the scheduler's identity; ``ca_pem`` the CA an HTTPS extender is checked against
    unless its spec names its own.
    """
    profiles: list[Json] = [{"schedulerName": "default-scheduler"}]
    if setup.scheduler_name != "default-scheduler":
        profiles.append({"schedulerName": setup.scheduler_name})
    profiles.extend(setup.extra_profiles)
    cfg: Json = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig), "qps": 500, "burst": 1000},
        "leaderElection": {"leaderElect": False},
        # Unset, clusters > 100 nodes are sampled and the extender sees only a subset.
        "percentageOfNodesToScore": 100,
        "profiles": profiles,
    }
    if setup.extender is not None:
        cfg["extenders"] = [setup.extender.to_config(ca_pem)]
    return cfg


def scheduler_argv(binary: Path, config_path: Path, port: int, cert_dir: Path, kubeconfig: Path, verbosity: int,
                   setup: SchedulerSetup) -> list[str]:
    """kube-scheduler's command line; ``kubeconfig`` also serves delegated authentication/authorization."""
    argv = [
        str(binary),
        f"--config={config_path}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={cert_dir}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--v={verbosity}",
    ]
    if setup.feature_gates:
        gates = ",".join(f"{k}={'true' if v else 'false'}" for k, v in sorted(setup.feature_gates.items()))
        argv.append(f"--feature-gates={gates}")
    argv.extend(setup.extra_args)
    return argv


def scheduler_ready(port: int) -> bool:
    """kube-scheduler's /readyz answers 200 (its informers synced); a kube-scheduler older than 1.31 serves no
    /readyz (404), its /healthz then (the process is up, informers maybe not yet synced: pods created meanwhile
    wait in its queue)."""
    insecure = ssl.create_default_context()
    # The scheduler serves a self-signed cert it generates itself; only its health endpoints are read here.
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", timeout=2, context=insecure) as r:
            return int(r.status) == 200
    except urllib.error.HTTPError as e:
        if e.code != 404:
            raise
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", timeout=2, context=insecure) as r:
        return int(r.status) == 200
