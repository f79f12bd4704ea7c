"""The `hami` chart against the real local control plane (kube-apiserver + kube-scheduler, no network).

* every rendered object of every values combination goes through the API server's server-side
  dry-run (``?dryRun=All&fieldValidation=Strict``: schema, defaulting, validation, admission),
  POSTed over HTTPS with the admin token of the plane's kubeconfig. cert-manager Issuer and
  Certificate come from CRDs this plane does not have: they are the only objects not validated.
* the pod templates pass Pod Security "restricted" (dry-run Pods in an enforcing namespace);
* the rendered KubeSchedulerConfiguration is accepted by the real kube-scheduler binary
  (``--write-config-to``) for every combination, and a kube-scheduler run with it becomes leader
  and calls an extender serving the chart's generated certificate over TLS;
* the rendered webhook registration fails closed for slice pods only;
* ``helm install`` / ``helm upgrade`` (certificate kept, pods rolled) / ``helm uninstall``.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from deploy.local.controlplane import ControlPlane
from deploy.local.identities import wait_no_policy
from deploy.local.processes import free_port
from tests.deploy._chart import (
    CASES,
    CHART,
    CRD_KINDS,
    Case,
    Json,
    container,
    embedded,
    find,
    helm_binary,
    helm_env,
    objects,
    one,
    run_helm,
    template,
    values_file,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def helm(pytestconfig: pytest.Config) -> Path:
    return helm_binary(pytestconfig)


# ----------------------------------------------------------------------------- a tiny REST client
class Api:
    """HTTPS + bearer token from the plane's kubeconfig, as kubectl would use it."""

    def __init__(self, kubeconfig: Path) -> None:
        kc = yaml.safe_load(kubeconfig.read_text())
        ctx = next(c["context"] for c in kc["contexts"] if c["name"] == kc["current-context"])
        cluster = next(c["cluster"] for c in kc["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in kc["users"] if u["name"] == ctx["user"])
        self.server = cluster["server"]
        self.token = user["token"]
        self.ssl = ssl.create_default_context(
            cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
        self._resources: dict[tuple[str, str], tuple[str, bool]] = {}

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Json]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=30, context=self.ssl) as r:
                raw = r.read()
                return int(r.status), json.loads(raw) if raw else {}
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                return int(e.code), json.loads(raw)
            except ValueError:
                return int(e.code), {"message": raw.decode(errors="replace")}

    def resource(self, api_version: str, kind: str) -> tuple[str, bool] | None:
        """(collection path prefix, namespaced) from discovery; None for kinds the server lacks."""
        key = (api_version, kind)
        if key not in self._resources:
            base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            status, doc = self.call("GET", base)
            if status == 404:
                return None
            assert status == 200, doc
            for r in doc["resources"]:
                if "/" not in r["name"]:
                    self._resources[(api_version, r["kind"])] = (f"{base}", r["namespaced"])
                    self._resources[(api_version, r["kind"] + "#plural")] = (r["name"], r["namespaced"])
        if key not in self._resources:
            return None
        base, namespaced = self._resources[key]
        plural, _ = self._resources[(api_version, kind + "#plural")]
        return f"{base}/{plural}", namespaced

    def collection(self, obj: Json) -> str:
        found = self.resource(obj["apiVersion"], obj["kind"])
        assert found is not None, obj["kind"]
        prefix, namespaced = found
        if namespaced:
            base, plural = prefix.rsplit("/", 1)
            return f"{base}/namespaces/{obj['metadata']['namespace']}/{plural}"
        return prefix

    def ensure_namespace(self, name: str, labels: dict[str, str] | None = None) -> None:
        status, doc = self.call("POST", "/api/v1/namespaces",
                                {"metadata": {"name": name, "labels": labels or {}}})
        assert status in (201, 409), doc

    def dry_run(self, obj: Json) -> tuple[int, Json]:
        return self.call("POST", self.collection(obj) + "?dryRun=All&fieldValidation=Strict", obj)


@pytest.fixture(scope="module")
def api(control_plane: ControlPlane) -> Api:
    return Api(control_plane.kubeconfig_path)


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


# ---------------------------------------------------------------------------- server-side dry-run
@pytest.mark.parametrize("name", sorted(CASES))
def test_every_object_passes_server_side_dry_run(helm: Path, api: Api, name: str) -> None:
    case = CASES[name]
    objs = objects(template(helm, case).stdout)
    api.ensure_namespace(case.namespace)
    skipped, failures = [], []
    for obj in objs:
        if (obj["apiVersion"], obj["kind"]) in CRD_KINDS:
            assert api.resource(obj["apiVersion"], obj["kind"]) is None
            skipped.append(obj["kind"])
            continue
        status, doc = api.dry_run(obj)
        if status != 201:
            failures.append(f"{obj['kind']}/{obj['metadata']['name']}: HTTP {status}: {doc.get('message')}")
    assert not failures, "\n".join(failures)
    if "cert-manager" in name or name == "hami-legacy":
        assert "Certificate" in skipped  # cannot be validated here: no cert-manager CRDs
    elif name == "monitoring":
        assert skipped == ["PrometheusRule"]  # no Prometheus Operator CRDs here (tests/deploy/test_monitoring.py)
    else:
        assert not skipped


def test_pods_pass_pod_security_restricted(helm: Path, api: Api) -> None:
    ns = _unique("helm-psa")
    api.ensure_namespace(ns, {"pod-security.kubernetes.io/enforce": "restricted",
                              "pod-security.kubernetes.io/enforce-version": "latest"})
    checked = 0
    for name in ("defaults", "custom", "disabled"):
        for d in find(objects(template(helm, CASES[name]).stdout), "Deployment"):
            tpl = d["spec"]["template"]
            pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": d["metadata"]["name"], "namespace": ns, "labels": tpl["metadata"]["labels"]},
                   "spec": tpl["spec"]}
            status, doc = api.dry_run(pod)
            assert status == 201, f"{name} {d['metadata']['name']}: {doc.get('message')}"
            checked += 1
    assert checked >= 9
    # The namespace does enforce: the same pod without its security context is refused.
    status, doc = api.dry_run({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "control", "namespace": ns},
                               "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
    assert status == 403 and "restricted" in doc.get("message", ""), doc


# ------------------------------------------------------------------------------- kube-scheduler
def _scheduler_files(objs: list[Json], fullname: str, kubeconfig: Path, workdir: Path) -> Path:
    """The rendered KubeSchedulerConfiguration, pointed at the plane (the pod uses in-cluster config)
    and at a CA file on this host instead of the Secret mount."""
    ksc = embedded(objs, f"{fullname}-scheduler", "scheduler-config.yaml")
    ksc["clientConnection"] = {"kubeconfig": str(kubeconfig)}
    for ext in ksc.get("extenders", []):
        if not ext["enableHTTPS"]:  # scheduler.extender.scheme http (the default): no certificate to check
            assert "tlsConfig" not in ext and ext["urlPrefix"].startswith("http://127.0.0.1:")
            continue
        assert ext["tlsConfig"]["caFile"] == "/etc/mtsched/tls/ca.crt"
        secrets = [s for s in find(objs, "Secret") if "ca.crt" in s["data"]]  # not the Redis password's
        ca = base64.b64decode(secrets[0]["data"]["ca.crt"]) if secrets else _throwaway_ca()
        (workdir / "ca.crt").write_bytes(ca)
        ext["tlsConfig"]["caFile"] = str(workdir / "ca.crt")
    path = workdir / "scheduler-config.yaml"
    path.write_text(yaml.safe_dump(ksc, sort_keys=False))
    return path


def _throwaway_ca() -> bytes:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "throwaway-ca")])
    now = time.time()
    import datetime as dt

    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(dt.datetime.fromtimestamp(now - 60, dt.UTC))
            .not_valid_after(dt.datetime.fromtimestamp(now + 3600, dt.UTC))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM)


def _scheduler_argv(cp: ControlPlane, config: Path, port: int) -> list[str]:
    kc = str(cp.kubeconfig_path)
    return [str(cp.bin_dir / "kube-scheduler"), f"--config={config}", "--bind-address=127.0.0.1",
            f"--secure-port={port}", f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
            "--v=2"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_kube_scheduler_accepts_the_rendered_configuration(helm: Path, control_plane: ControlPlane,
                                                           name: str) -> None:
    case = CASES[name]
    fullname = case.release if "hami" in case.release else f"{case.release}-hami"
    objs = objects(template(helm, case).stdout)
    with tempfile.TemporaryDirectory(prefix="helm-ksc-") as tmp:
        work = Path(tmp)
        config = _scheduler_files(objs, fullname, control_plane.kubeconfig_path, work)
        out = work / "effective.yaml"
        # --write-config-to: load, default and validate the file, build the profiles and the
        # extender clients (reads caFile), write the effective configuration and exit.
        proc = subprocess.run([*_scheduler_argv(control_plane, config, 0), f"--write-config-to={out}"],
                              capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0 and out.exists(), proc.stderr[-3000:]
        effective = yaml.safe_load(out.read_text())
    rendered = embedded(objs, f"{fullname}-scheduler", "scheduler-config.yaml")
    assert [p["schedulerName"] for p in effective["profiles"]] == [p["schedulerName"] for p in rendered["profiles"]]
    assert effective["leaderElection"]["leaderElect"] is True
    # as the chart asked (its default 100; 0, the custom case, is kube-scheduler's adaptive share, kept as 0)
    assert effective["percentageOfNodesToScore"] == rendered["percentageOfNodesToScore"] == (
        case.values.get("scheduler", {}).get("percentageOfNodesToScore", 100))
    if CASES[name].values.get("devices", {}).get("mthreads", {}).get("enabled", True):
        [ext] = effective["extenders"]
        assert ext["managedResources"][0]["ignoredByScheduler"] is True
        assert ext["nodeCacheCapable"] is True and ext["httpTimeout"] == "30s"
    else:
        assert not effective.get("extenders")


class _FakeExtender(BaseHTTPRequestHandler):
    calls: ClassVar[list[tuple[str, Json]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        _FakeExtender.calls.append((self.path, body))
        names = body.get("NodeNames") or []
        out = {"NodeNames": [], "FailedNodes": {n: "helm-e2e: no cards" for n in names}, "Error": ""}
        raw = json.dumps(out).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def fake_extender() -> Iterator[tuple[int, Path, list[tuple[str, Json]]]]:
    """A port, a scratch directory and the call log of an HTTPS 'extender' the test starts on
    127.0.0.1 with the chart's generated certificate."""
    _FakeExtender.calls = []
    with tempfile.TemporaryDirectory(prefix="helm-ext-") as tmp:
        yield free_port(), Path(tmp), _FakeExtender.calls


def _serve(port: int, cert: Path | None = None, key: Path | None = None) -> ThreadingHTTPServer:
    """The fake extender on 127.0.0.1: plain HTTP, or HTTPS with the given certificate."""
    server = ThreadingHTTPServer(("127.0.0.1", port), _FakeExtender)
    if cert is not None and key is not None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _wait(what: str, check: Any, timeout: float, proc: subprocess.Popen[bytes] | None = None,
          log: Path | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = check()
        except (OSError, ssl.SSLError, urllib.error.URLError):
            got = None
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.3)
    noise = ("extension-apiserver-authentication", "configmap_cafile_content")
    lines = log.read_text().splitlines() if log and log.exists() else []
    tail = "\n".join([ln for ln in lines if not any(n in ln for n in noise)][-40:])
    raise AssertionError(f"timed out waiting for {what}\n{tail}")


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_rendered_scheduler_runs_elects_and_calls_the_extender(
        helm: Path, control_plane: ControlPlane, api: Api,
        fake_extender: tuple[int, Path, list[tuple[str, Json]]], scheme: str) -> None:
    """The rendered KubeSchedulerConfiguration reaches the extender with each scheduler.extender.scheme: plain
    HTTP (the default), or HTTPS with kube-scheduler checking the chart's certificate against the rendered
    caFile (an extender serving plain HTTP there, or the other way round, gets no /filter call)."""
    port, work, calls = fake_extender
    scheduler_name = _unique("helm-e2e")
    # rendered for this plane's kube-scheduler (its arguments and readiness path follow the image tag)
    tag = control_plane.scheduler_version.split()[-1]
    objs = objects(template(helm, Case(sets=(f"schedulerName={scheduler_name}", f"scheduler.extender.port={port}",
                                             f"scheduler.extender.scheme={scheme}",
                                             f"scheduler.kubeScheduler.image.tag={tag}"))).stdout)
    rendered = container(one(objs, "Deployment", "hami-scheduler"), "kube-scheduler")
    assert rendered["command"][:2] == ["kube-scheduler", "--config=/etc/kubernetes/hami/scheduler-config.yaml"]
    ready_path = rendered["readinessProbe"]["httpGet"]["path"]
    secret = one(objs, "Secret", "hami-scheduler-tls")["data"]
    for key in ("tls.crt", "tls.key"):
        (work / key).write_bytes(base64.b64decode(secret[key]))
    server = _serve(port, *((work / "tls.crt", work / "tls.key") if scheme == "https" else ()))
    config = _scheduler_files(objs, "hami", control_plane.kubeconfig_path, work)
    sched_port = free_port()
    log = work / "kube-scheduler.log"
    node, ns, pod = _unique("helm-e2e-node"), _unique("helm-e2e"), "vgpu-pod"
    with log.open("wb") as out:
        proc = subprocess.Popen([*_scheduler_argv(control_plane, config, sched_port), *rendered["command"][2:]],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE

        def ready() -> bool:  # as the rendered readinessProbe asks
            with urllib.request.urlopen(f"https://127.0.0.1:{sched_port}{ready_path}", timeout=2,
                                        context=insecure) as r:
                return int(r.status) == 200

        _wait(f"kube-scheduler {ready_path}", ready, 60, proc, log)

        def leader() -> str | None:
            status, lease = api.call("GET", f"/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/"
                                            f"{scheduler_name}")
            return lease.get("spec", {}).get("holderIdentity") if status == 200 else None

        assert _wait("the leader lease", leader, 60, proc, log)

        # sgpu-core/-memory are ordinary extended resources kube-scheduler checks itself; only
        # mthreads.com/vgpu is managed by (and ignored for) the extender.
        capacity = {"cpu": "8", "memory": "32Gi", "pods": "110",
                    "mthreads.com/sgpu-core": "16", "mthreads.com/sgpu-memory": "96"}
        status, doc = api.call("POST", "/api/v1/nodes", {
            "metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}},
            "status": {"capacity": capacity, "allocatable": capacity}})
        assert status == 201, doc
        api.ensure_namespace(ns)
        status, doc = api.call("POST", f"/api/v1/namespaces/{ns}/pods", {
            "metadata": {"name": pod},
            "spec": {"schedulerName": scheduler_name, "containers": [{
                "name": "c", "image": "busybox",
                "resources": {"limits": {"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "32",
                                         "mthreads.com/sgpu-core": "8"}}}]}})
        assert status == 201, doc

        def filtered() -> bool:
            return any(p == "/filter" and b.get("Pod", {}).get("metadata", {}).get("name") == pod for p, b in calls)

        # With https, only reachable if kube-scheduler trusted the certificate via the rendered caFile.
        _wait(f"a /filter call over {scheme}", filtered, 60, proc, log)
        body = next(b for p, b in calls if p == "/filter")
        assert node in body["NodeNames"] and not body.get("Nodes")  # nodeCacheCapable: names only
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        server.shutdown()
        api.call("DELETE", f"/api/v1/namespaces/{ns}/pods/{pod}?gracePeriodSeconds=0")
        api.call("DELETE", f"/api/v1/nodes/{node}")
        api.call("DELETE", f"/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/{scheduler_name}")


# ------------------------------------------------------------------------------------ webhook
def test_rendered_webhook_fails_closed_for_slice_pods_only(helm: Path, api: Api) -> None:
    label = _unique("run")
    ns = _unique("helm-webhook")
    home = _unique("helm-release")  # the release namespace: where our own pods run
    release = _unique("hami-wh")
    objs = objects(template(helm, Case(
        {"scheduler": {"admissionWebhook": {"namespaceSelector": {"matchLabels": {"mtsched-helm-e2e": label}}}}},
        release=release, namespace=home)).stdout)
    hook = one(objs, "MutatingWebhookConfiguration", f"{release}-webhook")
    status, doc = api.call("POST", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations", hook)
    assert status == 201, doc
    api.ensure_namespace(ns, {"mtsched-helm-e2e": label})
    api.ensure_namespace(home, {"mtsched-helm-e2e": label})
    gpu = {"limits": {"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "32", "mthreads.com/sgpu-core": "8"}}
    refused = 'failed calling webhook "vgpu.hami.io"'

    def create(resources: Json | None = None, labels: dict[str, str] | None = None,
               annotations: dict[str, str] | None = None, init: bool = False, where: str = ns) -> tuple[int, Json]:
        spec: Json = {"containers": [{"name": "c", "image": "busybox", "resources": {} if init else resources or {}}]}
        if init:
            spec["initContainers"] = [{"name": "i", "image": "busybox", "resources": resources}]
        return api.call("POST", f"/api/v1/namespaces/{where}/pods", {
            "metadata": {"name": _unique("pod"), "labels": labels or {}, "annotations": annotations or {}},
            "spec": spec})

    def effective() -> bool:
        # The API server picks new webhook configurations up through an informer.
        status, doc = create(gpu)
        if status == 201:
            api.call("DELETE", f"/api/v1/namespaces/{ns}/pods/{doc['metadata']['name']}?gracePeriodSeconds=0")
        return status >= 400 and refused in doc.get("message", "")

    try:
        _wait("the webhook configuration to take effect", effective, 30)
        # No webhook endpoint exists: slice pods are refused (failurePolicy Fail), not admitted
        # unvalidated; so are init-container slices and pods forging the scheduler's annotations.
        for kwargs in ({"resources": gpu}, {"resources": gpu, "init": True},
                       {"annotations": {"hami.io/vgpu-node": "n1"}}):
            status, doc = create(**kwargs)  # type: ignore[arg-type]
            assert status >= 400 and refused in doc.get("message", ""), (kwargs, doc)
        # Pods asking for no slice are never sent (matchConditions): a webhook outage cannot block them.
        for kwargs in ({}, {"resources": {"limits": {"cpu": "1", "mthreads.com/gpu": "1"}}}):
            status, doc = create(**kwargs)  # type: ignore[arg-type]
            assert status == 201, (kwargs, doc)
        # A pod label skips nothing (HAMi's hami.io/webhook=ignore was anyone's to set) ...
        status, doc = create(gpu, labels={"hami.io/webhook": "ignore", "mtsched.io/webhook": "ignore"})
        assert status >= 400 and refused in doc.get("message", ""), doc
        # ... our own pods are skipped by their namespace, whose name the API server sets.
        status, doc = create(gpu, where=home)
        assert status == 201, doc
    finally:
        api.call("DELETE", f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{release}-webhook")
        for where in (ns, home):
            api.call("DELETE", f"/api/v1/namespaces/{where}/pods?gracePeriodSeconds=0")


# ------------------------------------------------------------------------- helm install/upgrade
def test_helm_install_upgrade_uninstall(helm: Path, control_plane: ControlPlane, api: Api) -> None:
    release = _unique("hami-e2e")
    ns = _unique("helm-release")
    label = {"scheduler": {"admissionWebhook": {"namespaceSelector": {"matchLabels": {"mtsched-helm-e2e": release}}}}}
    with tempfile.TemporaryDirectory(prefix="helm-home-") as home:
        env = helm_env(Path(home))
        env["KUBECONFIG"] = str(control_plane.kubeconfig_path)

        def run(*args: str, values: Json | None = None) -> str:
            with values_file(values or label) as vf:
                return run_helm(helm, [*args, "--namespace", ns, "-f", str(vf)], env=env).stdout

        try:
            out = run("install", release, str(CHART), "--create-namespace")
            assert "STATUS: deployed" in out and "Card models (devices.mthreads.memoryPerCard): [96]" in out
            _, secret = api.call("GET", f"/api/v1/namespaces/{ns}/secrets/{release}-scheduler-tls")
            _, redis_auth = api.call("GET", f"/api/v1/namespaces/{ns}/secrets/{release}-redis-auth")
            _, deploy = api.call("GET", f"/apis/apps/v1/namespaces/{ns}/deployments/{release}-scheduler")
            # Empty image tag: the version the cluster reports.
            assert container(deploy, "kube-scheduler")["image"] == "registry.k8s.io/kube-scheduler:v" + \
                _server_version(api)
            before = deploy["spec"]["template"]["metadata"]["annotations"]
            _, hook_deploy = api.call("GET", f"/apis/apps/v1/namespaces/{ns}/deployments/{release}-webhook")
            tls_before = hook_deploy["spec"]["template"]["metadata"]["annotations"]["checksum/tls"]

            upgraded = {**label, "devices": {"mthreads": {"memoryPerCard": [96, 160]}}}
            run("upgrade", release, str(CHART), values=upgraded)
            _, secret2 = api.call("GET", f"/api/v1/namespaces/{ns}/secrets/{release}-scheduler-tls")
            assert secret2["data"] == secret["data"]  # lookup kept the certificate
            _, redis_auth2 = api.call("GET", f"/api/v1/namespaces/{ns}/secrets/{release}-redis-auth")
            assert redis_auth2["data"] == redis_auth["data"] and redis_auth["data"]["password"]  # and the password
            _, deploy2 = api.call("GET", f"/apis/apps/v1/namespaces/{ns}/deployments/{release}-scheduler")
            after = deploy2["spec"]["template"]["metadata"]["annotations"]
            assert after["checksum/config"] != before["checksum/config"]  # the pods roll
            _, hook_deploy2 = api.call("GET", f"/apis/apps/v1/namespaces/{ns}/deployments/{release}-webhook")
            assert hook_deploy2["spec"]["template"]["metadata"]["annotations"]["checksum/tls"] == tls_before
            _, cm = api.call("GET", f"/api/v1/namespaces/{ns}/configmaps/{release}-config")
            assert yaml.safe_load(cm["data"]["config.yaml"])["memoryPerCard"] == [96, 160]
            _, hook = api.call("GET", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/"
                                      f"{release}-webhook")
            assert base64.b64decode(hook["webhooks"][0]["clientConfig"]["caBundle"]) == \
                base64.b64decode(secret["data"]["ca.crt"])
            policy = f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/{release}-allocation-records"
            assert api.call("GET", policy)[0] == 200
        finally:
            run_helm(helm, ["uninstall", release, "--namespace", ns], env=env, check=False)
            # its admission policy exempts only this release's ServiceAccounts: gone before the next test
            wait_no_policy(control_plane)
        for path in (f"/apis/apps/v1/namespaces/{ns}/deployments/{release}-scheduler",
                     f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{release}-extender",
                     f"/apis/rbac.authorization.k8s.io/v1/namespaces/kube-system/rolebindings/"
                     f"{release}-scheduler-auth-reader",
                     f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{release}-webhook",
                     f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/"
                     f"{release}-allocation-records"):
            assert api.call("GET", path)[0] == 404, path


@pytest.mark.parametrize(("sets", "notes"), [
    ((), "Card models (devices.mthreads.memoryPerCard): [96]"),
    (("devices.mthreads.memoryPerCard={96,160}",), "[96,160]"),
    (("tls.mode=external",), "kubectl patch mutatingwebhookconfiguration hami-webhook"),
    (("devices.mthreads.enabled=false",), "only a plain kube-scheduler profile"),
    (("device.mthreads.enabled=true",), 'the value "device" is ignored'),
])
def test_helm_install_server_dry_run(helm: Path, control_plane: ControlPlane, sets: tuple[str, ...],
                                     notes: str) -> None:
    """helm's own install path (cluster capabilities, lookup, OpenAPI validation) and the NOTES.
    cert-manager combinations cannot run here: helm refuses kinds the cluster does not serve."""
    with tempfile.TemporaryDirectory(prefix="helm-home-") as home:
        env = helm_env(Path(home))
        env["KUBECONFIG"] = str(control_plane.kubeconfig_path)
        args = ["install", "hami", str(CHART), "--namespace", "kube-system", "--dry-run=server"]
        for s in sets:
            args += ["--set", s]
        out = run_helm(helm, args, env=env).stdout
    assert notes in out.split("NOTES:", 1)[1]


def _server_version(api: Api) -> str:
    status, doc = api.call("GET", "/version")
    assert status == 200
    return str(doc["gitVersion"]).lstrip("v").split("-")[0].split("+")[0]
