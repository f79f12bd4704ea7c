"""Admission webhook configurations for pods, and the canaries that tell when the apiserver uses them.

The apiserver loads webhook configurations through an informer, so a new one takes effect a little
later. Each configuration is written with a *canary* webhook listed first, served by a throwaway
server in the harness and scoped to the namespace ``mtsched-harness-canary`` (which the real
webhooks' namespaceSelector always excludes): once a dry-run pod create there reached the canary,
the configuration object (loaded atomically) is live. ``ControlPlane.register_webhooks`` drives it.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from deploy.local.errors import ControlPlaneError

Json = dict[str, Any]

CANARY_NAMESPACE = "mtsched-harness-canary"
# Created with dryRun=All in CANARY_NAMESPACE: webhooks with sideEffects None are still called.
CANARY_POD: Json = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"generateName": "canary-", "labels": {"mtsched.io/harness-canary": "true"}},
    "spec": {"containers": [{"name": "c", "image": "canary.invalid/none"}]},
}


class _CanaryHandler(BaseHTTPRequestHandler):
    """Admission webhook that allows everything and records which paths were called."""

    server: CanaryServer

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        review = json.loads(self.rfile.read(length) or b"{}")
        uid = (review.get("request") or {}).get("uid", "")
        with self.server.lock:
            # The apiserver appends ?timeout=Ns to webhook URLs.
            self.server.seen.add(urllib.parse.urlsplit(self.path).path)
        body = json.dumps(
            {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {"uid": uid, "allowed": True},
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class CanaryServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, cert: Path, key: Path) -> None:
        super().__init__(("127.0.0.1", 0), _CanaryHandler)
        self.lock = threading.Lock()
        self.seen: set[str] = set()
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self.socket = ctx.wrap_socket(self.socket, server_side=True)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def saw(self, path: str) -> bool:
        with self.lock:
            return path in self.seen


def webhook_path(kind: str) -> str:
    plural = "mutatingwebhookconfigurations" if kind == "mutating" else "validatingwebhookconfigurations"
    return f"/apis/admissionregistration.k8s.io/v1/{plural}"


def exclude_canary_namespace(selector: Json | None) -> Json:
    sel: Json = json.loads(json.dumps(selector or {}))  # deep copy, never mutate the caller's dict
    sel.setdefault("matchExpressions", []).append(
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": [CANARY_NAMESPACE]}
    )
    return sel


def webhooks_with_canary(
    kind: str,
    name: str,
    url: str,
    ca_pem: bytes,
    canary_url: str,
    canary_ca_pem: bytes,
    *,
    namespace_selector: Json | None,
    object_selector: Json | None,
    operations: Sequence[str],
    failure_policy: str,
    timeout_seconds: int,
    reinvocation_policy: str,
    hook_name: str | None = None,
) -> list[Json]:
    """[canary, real]: the ``webhooks`` of one configuration of ``kind`` (mutating or validating); the real one is
    named ``hook_name`` (what admission errors quote), by default ``pods.{kind}.{name}.mtsched.io``."""
    real: Json = {
        "name": hook_name or f"pods.{kind}.{name}.mtsched.io",
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": failure_policy,
        "timeoutSeconds": timeout_seconds,
        "matchPolicy": "Equivalent",
        "clientConfig": {"url": url, "caBundle": base64.b64encode(ca_pem).decode()},
        "rules": [
            {
                "operations": list(operations),
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": ["pods"],
                "scope": "Namespaced",
            }
        ],
    }
    real["namespaceSelector"] = exclude_canary_namespace(namespace_selector)
    if object_selector is not None:
        real["objectSelector"] = object_selector
    if kind == "mutating":
        real["reinvocationPolicy"] = reinvocation_policy
    probe = {
        **real,
        "name": f"canary.{kind}.{name}.mtsched.io",
        "failurePolicy": "Ignore",
        "timeoutSeconds": 2,
        "clientConfig": {"url": canary_url, "caBundle": base64.b64encode(canary_ca_pem).decode()},
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": CANARY_NAMESPACE}},
        "rules": [{**real["rules"][0], "operations": ["CREATE"]}],
    }
    probe.pop("objectSelector", None)
    return [probe, real]


def webhook_configuration(kind: str, config_name: str, webhooks: list[Json]) -> Json:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration" if kind == "mutating" else "ValidatingWebhookConfiguration",
        "metadata": {"name": config_name, "labels": {"app.kubernetes.io/managed-by": "mtsched-harness"}},
        "webhooks": webhooks,
    }


def without_canaries(config: Json) -> Json:
    """The configuration with its canary webhooks removed (edited in place and returned)."""
    config["webhooks"] = [w for w in config["webhooks"] if not w["name"].startswith("canary.")]
    return config


def wait_for_canaries(canary: CanaryServer, paths: list[str], timeout: float,
                      dry_run: Callable[[], tuple[int, bytes]]) -> None:
    """Repeat ``dry_run`` (a canary pod create: status, body) until every canary path was called."""
    deadline = time.monotonic() + timeout
    last = ""
    while not all(canary.saw(p) for p in paths):
        if time.monotonic() > deadline:
            raise ControlPlaneError(
                f"webhook configs not live after {timeout}s (canaries seen: "
                f"{[p for p in paths if canary.saw(p)]}); last dry-run reply: {last[:500]}"
            )
        status, raw = dry_run()
        last = f"{status} {raw.decode(errors='replace')}"
        if not all(canary.saw(p) for p in paths):
            time.sleep(0.1)
