"""kube-apiserver for the harness: its command line, the admin's static token and kubeconfig."""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from deploy.local.pki import PkiPaths
from shared.domain.nudge import minor_of

ADMIN_TOKEN_USER = "harness-admin"


def token_file(token: str) -> str:
    """The --token-auth-file line of the admin."""
    # Static token in system:masters: bypasses RBAC, no client certs to juggle in Python.
    return f'{token},{ADMIN_TOKEN_USER},{ADMIN_TOKEN_USER},"system:masters"\n'


def admin_kubeconfig(server_url: str, ca_pem: bytes, token: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "mtsched-local",
                "cluster": {
                    "server": server_url,
                    "certificate-authority-data": base64.b64encode(ca_pem).decode(),
                },
            }
        ],
        "users": [{"name": ADMIN_TOKEN_USER, "user": {"token": token}}],
        "contexts": [
            {"name": "mtsched-local", "context": {"cluster": "mtsched-local", "user": ADMIN_TOKEN_USER}}
        ],
        "current-context": "mtsched-local",
    }


def webhook_client_kubeconfig(pki: PkiPaths) -> dict[str, Any]:
    """Who kube-apiserver is to the webhooks it calls: user "*" (every webhook host) presents the harness's
    API server client certificate, when a webhook asks for one (webhookClientCAFile)."""
    return {"apiVersion": "v1", "kind": "Config",
            "users": [{"name": "*", "user": {"client-certificate": str(pki.webhook_client_crt),
                                             "client-key": str(pki.webhook_client_key)}}]}


def admission_config(webhook_kubeconfig: Path) -> dict[str, Any]:
    """--admission-control-config-file: both webhook plugins authenticate with `webhook_kubeconfig`."""
    plugin = {"apiVersion": "apiserver.config.k8s.io/v1", "kind": "WebhookAdmissionConfiguration",
              "kubeConfigFile": str(webhook_kubeconfig)}
    return {"apiVersion": "apiserver.config.k8s.io/v1", "kind": "AdmissionConfiguration",
            "plugins": [{"name": name, "configuration": plugin}
                        for name in ("MutatingAdmissionWebhook", "ValidatingAdmissionWebhook")]}


def version_args(version: str) -> list[str]:
    """What kube-apiserver `version` ("Kubernetes v1.30.14") needs beyond the common flags: 1.29 and 1.30 bind a
    token to a Node (identities.node_bound_token, the node agent's tests) only with the alpha feature gate
    ServiceAccountTokenNodeBinding (Beta and on from 1.31). A pod's token in a cluster is bound to the pod, whose
    node name 1.30 already puts into the user's extra (ServiceAccountTokenPodNodeInfo, Beta and on)."""
    minor = minor_of(version)
    return ["--feature-gates=ServiceAccountTokenNodeBinding=true"] if minor in (29, 30) else []


def apiserver_argv(binary: Path, etcd_url: str, port: int, pki: PkiPaths, tokens: Path, *, watch_cache: bool,
                   verbosity: int, extra: Sequence[str], admission: Path | None = None) -> list[str]:
    return [
        str(binary),
        f"--etcd-servers={etcd_url}",
        "--bind-address=127.0.0.1",
        # Loopback advertise address: no dependence on a default route (see the run notes).
        "--advertise-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={pki.dir}",
        f"--tls-cert-file={pki.apiserver_crt}",
        f"--tls-private-key-file={pki.apiserver_key}",
        f"--client-ca-file={pki.ca_crt}",
        f"--token-auth-file={tokens}",
        "--authorization-mode=RBAC",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki.sa_pub}",
        f"--service-account-signing-key-file={pki.sa_key}",
        "--service-cluster-ip-range=10.0.0.0/24",
        "--allow-privileged=true",
        # The loopback advertise address must not land in Endpoints "kubernetes".
        "--endpoint-reconciler-type=none",
        # No kubelet and no kube-controller-manager (see deploy/local/controlplane.py).
        "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
        # Mass creates in load tests should not be throttled by APF.
        "--enable-priority-and-fairness=false",
        "--max-requests-inflight=0",
        "--max-mutating-requests-inflight=0",
        "--profiling=false",
        f"--watch-cache={'true' if watch_cache else 'false'}",
        f"--v={verbosity}",
        *([f"--admission-control-config-file={admission}"] if admission else []),
        *extra,
    ]


def admin_request(url: str, token: str, context: ssl.SSLContext | None, method: str, body: Any = None, *,
                  content_type: str = "application/json", timeout: float = 30.0) -> tuple[int, bytes]:
    """One call as the admin: (status, body), whatever the status."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Authorization", f"Bearer {token}")
    req.add_header("Accept", "application/json")
    if data is not None:
        req.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as r:
            return int(r.status), bytes(r.read())
    except urllib.error.HTTPError as e:
        return int(e.code), bytes(e.read())
