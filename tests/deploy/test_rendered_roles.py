"""The real `mtsched webhook` process started with the chart's rendered config.yaml and generated
certificate (container paths swapped for host paths): memoryPerCard reaches the admission
decision, and the certificate verifies as the API server and kube-scheduler check it."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
import yaml

from deploy.local.redis import RedisServer
from tests.deploy._chart import ROOT, Json, one

pytestmark = pytest.mark.redis

Rendered = Callable[[str], list[Json]]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def webhook_process(objs: list[Json], redis_url: str, extra_env: Mapping[str, str] | None = None,
                    mounts: Mapping[str, bytes] | None = None) -> Iterator[tuple[int, Path]]:
    """`mtsched webhook` with the rendered config (and `extra_env`, e.g. the pod's MTSCHED_REDIS_PASSWORD) and
    the rendered container's own `--set=webhookClient...` arguments, each container file of `mounts` (path ->
    content) at a host path; yields (HTTPS port, CA file)."""
    data = {k: base64.b64decode(v) for k, v in one(objs, "Secret", "hami-scheduler-tls")["data"].items()}
    config = one(objs, "ConfigMap", "hami-config")["data"]["config.yaml"]
    assert yaml.safe_load(config)["tlsCertFile"] == "/etc/mtsched/tls/tls.crt"
    port, metrics = _port(), _port()
    with tempfile.TemporaryDirectory(prefix="helm-role-") as tmp:
        work = Path(tmp)
        for name, raw in data.items():
            (work / name).write_bytes(raw)
        (work / "config.yaml").write_text(config)
        own = []  # the chart's arguments of the container, its mounted files swapped for host files
        container = one(objs, "Deployment", "hami-webhook")["spec"]["template"]["spec"]["containers"][0]
        for arg in container["args"]:
            if arg.startswith("--set=webhookClient"):
                for path, content in (mounts or {}).items():
                    if path in arg:
                        host = work / Path(path).name
                        host.write_bytes(content)
                        arg = arg.replace(path, str(host))
                own.append(arg)
        env = {k: v for k, v in os.environ.items() if not k.startswith("MTSCHED_")}
        env.update(extra_env or {})
        argv = [sys.executable, "-m", "controller.cli", "webhook", "--config", str(work / "config.yaml"),
                "--log-format", "text",
                f"--set=listen=127.0.0.1:{port}", f"--set=metricsListen=127.0.0.1:{metrics}",
                f"--set=tlsCertFile={work / 'tls.crt'}", f"--set=tlsKeyFile={work / 'tls.key'}",
                f"--set=redisUrl={redis_url}", f"--set=keyPrefix=helm-{uuid.uuid4().hex[:8]}",
                "--set=quotaCheck=false", *own]  # no API server here (the quota check: tests/e2e/test_quota.py)
        log = (work / "webhook.log").open("wb")
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/readyz", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("mtsched webhook did not become ready:\n"
                                         + (work / "webhook.log").read_text()[-3000:])
                time.sleep(0.2)
            yield port, work / "ca.crt"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()


def review(port: int, ca: Path, server_name: str, memory: int, client: tuple[Path, Path] | None = None,
           status: bytes = b"200") -> Json:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
           "spec": {"containers": [{"name": "c", "image": "busybox", "resources": {"limits": {
               "mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": str(memory), "mthreads.com/sgpu-core": "8"}}}]}}
    body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "operation": "CREATE",
        "namespace": "default", "object": pod}}).encode()
    ctx = ssl.create_default_context(cafile=str(ca))  # verifies the chain *and* the name
    if client is not None:
        ctx.load_cert_chain(*client)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname=server_name) as tls:
        tls.sendall(b"POST /mutate HTTP/1.1\r\nHost: " + server_name.encode() + b"\r\n"
                    b"Content-Type: application/json\r\nConnection: close\r\n"
                    b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        chunks = []
        while chunk := tls.recv(65536):
            chunks.append(chunk)
    head, _, payload = b"".join(chunks).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 " + status), head
    out: Json = json.loads(payload)
    return out["response"] if status == b"200" else out


@pytest.mark.parametrize(("name", "allowed_128"), [("defaults", False), ("s5000", True), ("mixed", True)])
def test_webhook_runs_with_the_rendered_config(rendered: Rendered, redis_server: RedisServer,
                                               name: str, allowed_128: bool) -> None:
    with webhook_process(rendered(name), redis_server.url) as (port, ca):
        # As the API server reaches it (Service DNS name) and as kube-scheduler reaches the extender (IP).
        for server_name in ("hami-webhook.kube-system.svc", "127.0.0.1"):
            small = review(port, ca, server_name, 32)
            assert small["allowed"] is True
            patch = json.loads(base64.b64decode(small["patch"]))
            assert {"op": "add", "path": "/spec/schedulerName", "value": "hami-scheduler"} in patch
        big = review(port, ca, "hami-webhook.kube-system.svc", 128)  # valid only on an S5000 (160 units)
        assert big["allowed"] is allowed_128, big
        if not allowed_128:
            assert "memoryPerCard [96]" in big["status"]["message"]
        with pytest.raises(ssl.SSLCertVerificationError):
            review(port, ca, "some-other-service.kube-system.svc", 32)


def test_the_rendered_webhook_answers_only_the_api_servers_named_certificate(
        rendered: Rendered, redis_server: RedisServer, tmp_path: Path) -> None:
    from deploy.local.pki import make_ca, make_client_cert

    ca = make_ca("apiserver-client-ca")

    def client(name: str) -> tuple[Path, Path]:
        ck = make_client_cert(ca, name)
        (tmp_path / f"{name}.crt").write_bytes(ck.cert_pem)
        (tmp_path / f"{name}.key").write_bytes(ck.key_pem)
        return tmp_path / f"{name}.crt", tmp_path / f"{name}.key"

    objs = rendered("webhook-client-auth")  # caKey client-ca.pem, allowedNames kube-apiserver, apiserver.example.com
    mounts = {"/etc/mtsched/webhook-client-ca/client-ca.pem": ca.cert_pem}
    with webhook_process(objs, redis_server.url, mounts=mounts) as (port, server_ca):
        name = "hami-webhook.kube-system.svc"
        assert review(port, server_ca, name, 32, client("kube-apiserver"))["allowed"] is True
        refused = review(port, server_ca, name, 32, client("system:node:n1"), status=b"403")
        assert refused["code"] == 403
        assert "webhookClientNames allows apiserver.example.com, kube-apiserver" in refused["message"]
        # no certificate: the server ends the handshake with an alert, which the client reads as an error or,
        # with TLS 1.3 (the client's side of the handshake is done first), as the end of the stream
        with pytest.raises((ssl.SSLError, ConnectionError, AssertionError)) as e:
            review(port, server_ca, name, 32)
        assert not isinstance(e.value, AssertionError) or "b''" in str(e.value), e.value
