"""A real, local Kubernetes control plane (etcd + kube-apiserver + kube-scheduler) without Docker.

Used by the e2e tests and by the quick start (``python -m deploy.local up``). The binaries come
from ``build-binaries.sh`` (pinned Go modules, built once into ``~/.cache/mthreads-harness``).

There is no kubelet and no kube-controller-manager, which shapes the setup:

* ``TaintNodesByCondition`` is disabled, else every Node keeps ``node.kubernetes.io/not-ready``;
  ``ServiceAccount`` is disabled, else pods need the ``default`` ServiceAccount only KCM creates.
* Bound pods stay Pending with ``spec.nodeName`` set; delete them with grace 0.
* Namespaces never finish deleting: use unique names.

The class is synchronous on purpose (subprocesses + stdlib HTTP). From async code, call the
methods that talk to servers living in *your* event loop (``start_scheduler`` with an in-loop
extender, ``register_webhooks`` with an in-loop webhook) through ``asyncio.to_thread`` — the
``*_async`` wrappers do exactly that — otherwise the loop is blocked while the apiserver or the
scheduler is trying to call into it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any

import yaml

from deploy.local.pki import PkiPaths, write_pki

BUILD_SCRIPT = Path(__file__).with_name("build-binaries.sh")
BINARIES = ("etcd", "kube-apiserver", "kube-scheduler")
# Overrides the build script, e.g. for binaries built elsewhere.
BIN_DIR_ENV = "MTSCHED_K8S_BIN_DIR"
CANARY_NAMESPACE = "mtsched-harness-canary"
ADMIN_TOKEN_USER = "harness-admin"

Json = dict[str, Any]


class ControlPlaneError(RuntimeError):
    """A component failed to start or a harness request failed; the message carries log tails."""


class BuildError(RuntimeError):
    """build-binaries.sh failed."""


class ApiError(ControlPlaneError):
    def __init__(self, status: int, body: str, what: str) -> None:
        super().__init__(f"{what}: HTTP {status}: {body[:2000]}")
        self.status = status
        self.body = body


def go_available() -> bool:
    return shutil.which("go") is not None


def ensure_binaries(progress: IO[str] | None = None) -> Path:
    """Return the directory holding etcd, kube-apiserver and kube-scheduler, building them if needed.

    Idempotent and instant once built. ``progress`` receives the script's stderr (progress lines);
    None captures it for the error message instead.
    """
    override = os.environ.get(BIN_DIR_ENV)
    if override:
        d = Path(override)
        missing = [b for b in BINARIES if not (d / b).is_file()]
        if missing:
            raise BuildError(f"{BIN_DIR_ENV}={d} lacks {', '.join(missing)}")
        return d
    proc = subprocess.run(
        ["bash", str(BUILD_SCRIPT)],
        stdout=subprocess.PIPE,
        stderr=progress if progress is not None else subprocess.PIPE,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        tail = "" if progress is not None else "\n".join((proc.stderr or "").splitlines()[-30:])
        raise BuildError(f"{BUILD_SCRIPT} exited {proc.returncode}\n{tail}")
    out = proc.stdout.strip().splitlines()
    if not out:
        raise BuildError(f"{BUILD_SCRIPT} printed no bin dir")
    return Path(out[-1])


def free_port() -> int:
    # Bind-to-0 then close: a tiny race with other processes, acceptable for tests.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _default_workdir_parent() -> str | None:
    # tmpfs makes etcd and the apiserver noticeably faster to start and write.
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


def _tail(path: Path, lines: int) -> str:
    try:
        data = path.read_text(errors="replace").splitlines()
    except OSError as e:
        return f"<cannot read {path}: {e}>"
    return "\n".join(data[-lines:])


@dataclass
class _Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        if self.popen.poll() is not None:
            return
        # Each component runs in its own session, so its process group id is its pid.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(5)


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
    preempt_verb: str | None = None
    weight: int = 1
    node_cache_capable: bool = True
    http_timeout: str = "30s"
    ignorable: bool = False
    # (resource name, ignoredByScheduler). Non-empty => the extender is only called for pods that
    # request one of these in requests/limits of containers or initContainers.
    managed_resources: tuple[tuple[str, bool], ...] = (("mthreads.com/vgpu", True),)
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
class _SchedulerSetup:
    extender: ExtenderSpec | None
    scheduler_name: str
    extra_profiles: tuple[Json, ...]
    extra_args: tuple[str, ...]
    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    kubeconfig: Path | None = None  # None: the admin kubeconfig


class _CanaryHandler(BaseHTTPRequestHandler):
    """Admission webhook that allows everything and records which paths were called."""

    server: _CanaryServer

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


class _CanaryServer(ThreadingHTTPServer):
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


class ControlPlane:
    """etcd + kube-apiserver (+ kube-scheduler on demand), each in its own process group.

    Usage::

        with ControlPlane() as cp:           # or cp.start() ... cp.stop()
            cp.start_scheduler(ExtenderSpec("https://127.0.0.1:8443"))
            ... use cp.kubeconfig_path ...
    """

    def __init__(
        self,
        bin_dir: Path | str | None = None,
        workdir: Path | str | None = None,
        *,
        watch_cache: bool = True,
        extra_apiserver_args: Sequence[str] = (),
        keep_workdir: bool = False,
        apiserver_verbosity: int = 1,
        scheduler_verbosity: int = 2,
        start_timeout: float = 90.0,
    ) -> None:
        self._bin_dir = Path(bin_dir) if bin_dir is not None else None
        self._workdir_arg = Path(workdir) if workdir is not None else None
        self._workdir: Path | None = None
        self.watch_cache = watch_cache
        self.extra_apiserver_args = tuple(extra_apiserver_args)
        self.keep_workdir = keep_workdir or os.environ.get("MTSCHED_KEEP_WORKDIR") == "1"
        self.apiserver_verbosity = apiserver_verbosity
        self.scheduler_verbosity = scheduler_verbosity
        self.start_timeout = start_timeout
        self.token = "mtsched-" + uuid.uuid4().hex
        self._procs: dict[str, _Proc] = {}
        self._pki: PkiPaths | None = None
        self._etcd_port = 0
        self._api_port = 0
        self._sched_port = 0
        self._sched_setup: _SchedulerSetup | None = None
        self._client_ctx: ssl.SSLContext | None = None
        self.timings: dict[str, float] = {}

    # ----------------------------------------------------------------------------------- properties
    @property
    def workdir(self) -> Path:
        if self._workdir is None:
            raise ControlPlaneError("control plane not started")
        return self._workdir

    @property
    def bin_dir(self) -> Path:
        if self._bin_dir is None:
            self._bin_dir = ensure_binaries()
        return self._bin_dir

    @property
    def pki(self) -> PkiPaths:
        if self._pki is None:
            raise ControlPlaneError("control plane not started")
        return self._pki

    @property
    def ca_pem(self) -> bytes:
        return self.pki.ca_crt.read_bytes()

    @property
    def server_url(self) -> str:
        return f"https://127.0.0.1:{self._api_port}"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self._etcd_port}"

    @property
    def kubeconfig_path(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    @property
    def scheduler_running(self) -> bool:
        p = self._procs.get("kube-scheduler")
        return p is not None and p.alive()

    def exited_components(self) -> dict[str, Path]:
        """Components that should be running but exited: name -> log file."""
        return {name: p.log_path for name, p in self._procs.items() if not p.alive()}

    def server_ssl_context(self) -> ssl.SSLContext:
        """TLS context for webhook/extender servers: the harness serving cert (127.0.0.1, localhost)."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.pki.serving_crt, self.pki.serving_key)
        return ctx

    def client_ssl_context(self) -> ssl.SSLContext:
        """TLS context trusting the harness CA (for talking to the apiserver or harness servers)."""
        return ssl.create_default_context(cadata=self.ca_pem.decode())

    # ------------------------------------------------------------------------------------ lifecycle
    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> ControlPlane:
        """Start etcd and kube-apiserver; returns when /readyz is ok and namespace default exists."""
        t0 = time.monotonic()
        bin_dir = self.bin_dir
        if self._workdir_arg is not None:
            self._workdir = self._workdir_arg
            self._workdir.mkdir(parents=True, exist_ok=True)
        else:
            self._workdir = Path(tempfile.mkdtemp(prefix="mtsched-cp-", dir=_default_workdir_parent()))
        try:
            self._pki = write_pki(self.workdir / "pki")
            self._client_ctx = self.client_ssl_context()
            self._write_auth_files()
            self._start_etcd(bin_dir)
            self.timings["etcd"] = time.monotonic() - t0
            self._start_apiserver(bin_dir)
            self.timings["apiserver"] = time.monotonic() - t0
        except Exception as e:
            # Keep the logs for the post-mortem; the caller prints log_tails().
            self.keep_workdir = True
            self.stop()
            raise ControlPlaneError(f"{e}\n(workdir kept: {self.workdir})") from e
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every component (scheduler, apiserver, etcd) and remove the workdir unless kept."""
        for name in ("kube-scheduler", "kube-apiserver", "etcd"):
            p = self._procs.pop(name, None)
            if p is not None:
                p.stop()
        if self._workdir is not None and self._workdir_arg is None and not self.keep_workdir:
            shutil.rmtree(self._workdir, ignore_errors=True)

    def log_tails(self, lines: int = 40) -> str:
        """The last lines of every component log, for failure reports."""
        if self._workdir is None:
            return ""
        parts = []
        for log in sorted(self.workdir.glob("*.log")):
            parts.append(f"===== {log} (last {lines} lines) =====\n{_tail(log, lines)}")
        return "\n".join(parts)

    def _spawn(self, name: str, argv: list[str]) -> _Proc:
        log_path = self.workdir / f"{name}.log"
        with open(log_path, "ab") as log:
            log.write(f"\n# {time.strftime('%H:%M:%S')} {' '.join(argv)}\n".encode())
            log.flush()
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                start_new_session=True,  # own process group: stop() kills the whole group
            )
        proc = _Proc(name, popen, log_path)
        self._procs[name] = proc
        return proc

    def _wait(self, proc: _Proc, ready: Callable[[], bool], timeout: float | None = None) -> None:
        limit = timeout or self.start_timeout
        deadline = time.monotonic() + limit
        while True:
            if not proc.alive():
                raise ControlPlaneError(
                    f"{proc.name} exited with {proc.popen.returncode}\n{_tail(proc.log_path, 40)}"
                )
            with contextlib.suppress(OSError, ValueError, ssl.SSLError):
                if ready():
                    return
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"{proc.name} not ready after {limit}s\n{_tail(proc.log_path, 40)}")
            time.sleep(0.1)

    def _write_auth_files(self) -> None:
        # Static token in system:masters: bypasses RBAC, no client certs to juggle in Python.
        (self.workdir / "tokens.csv").write_text(
            f'{self.token},{ADMIN_TOKEN_USER},{ADMIN_TOKEN_USER},"system:masters"\n'
        )

    def _write_kubeconfig(self) -> None:
        kc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "mtsched-local",
                    "cluster": {
                        "server": self.server_url,
                        "certificate-authority-data": base64.b64encode(self.ca_pem).decode(),
                    },
                }
            ],
            "users": [{"name": ADMIN_TOKEN_USER, "user": {"token": self.token}}],
            "contexts": [
                {"name": "mtsched-local", "context": {"cluster": "mtsched-local", "user": ADMIN_TOKEN_USER}}
            ],
            "current-context": "mtsched-local",
        }
        self.kubeconfig_path.write_text(yaml.safe_dump(kc, sort_keys=False))
        self.kubeconfig_path.chmod(0o600)

    def _start_etcd(self, bin_dir: Path) -> None:
        self._etcd_port = free_port()
        peer = free_port()
        proc = self._spawn(
            "etcd",
            [
                str(bin_dir / "etcd"),
                "--name=harness",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=harness=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync=true",  # test data: durability is irrelevant, speed is not
                "--log-level=warn",
            ],
        )

        def ready() -> bool:
            with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as r:
                return bool(json.load(r).get("health") == "true")

        self._wait(proc, ready)

    def restart_apiserver(self) -> None:
        """Stop kube-apiserver and start it again on the same port and etcd: every watch stream and
        connection is cut, and clients must resume (fault tests)."""
        p = self._procs.pop("kube-apiserver", None)
        if p is not None:
            p.stop()
        self._start_apiserver(self.bin_dir, port=self._api_port)

    def _start_apiserver(self, bin_dir: Path, port: int = 0) -> None:
        self._api_port = port or free_port()
        pki = self.pki
        argv = [
            str(bin_dir / "kube-apiserver"),
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1",
            # Loopback advertise address: no dependence on a default route (see the run notes).
            "--advertise-address=127.0.0.1",
            f"--secure-port={self._api_port}",
            f"--cert-dir={pki.dir}",
            f"--tls-cert-file={pki.apiserver_crt}",
            f"--tls-private-key-file={pki.apiserver_key}",
            f"--client-ca-file={pki.ca_crt}",
            f"--token-auth-file={self.workdir / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--allow-privileged=true",
            # The loopback advertise address must not land in Endpoints "kubernetes".
            "--endpoint-reconciler-type=none",
            "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
            # Mass creates in load tests should not be throttled by APF.
            "--enable-priority-and-fairness=false",
            "--max-requests-inflight=0",
            "--max-mutating-requests-inflight=0",
            "--profiling=false",
            f"--watch-cache={'true' if self.watch_cache else 'false'}",
            f"--v={self.apiserver_verbosity}",
            *self.extra_apiserver_args,
        ]
        proc = self._spawn("kube-apiserver", argv)
        self._write_kubeconfig()

        def ready() -> bool:
            status, _ = self._http("GET", "/readyz")
            return status == 200

        self._wait(proc, ready)

        def default_ns() -> bool:
            status, _ = self._http("GET", "/api/v1/namespaces/default")
            return status == 200

        self._wait(proc, default_ns)

    # --------------------------------------------------------------------------------- API helpers
    def _http(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        timeout: float = 30.0,
    ) -> tuple[int, bytes]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server_url + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=self._client_ctx) as r:
                return int(r.status), bytes(r.read())
        except urllib.error.HTTPError as e:
            return int(e.code), bytes(e.read())

    def api(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        ok: Sequence[int] = (200, 201, 202),
    ) -> Any:
        """Minimal synchronous REST call as the admin; raises ApiError unless the status is in ``ok``."""
        status, raw = self._http(method, path, body, content_type=content_type)
        if status not in ok:
            raise ApiError(status, raw.decode(errors="replace"), f"{method} {path}")
        return json.loads(raw) if raw else None

    # ---------------------------------------------------------------------------------- scheduler
    def start_scheduler(
        self,
        extender: ExtenderSpec | None = None,
        scheduler_name: str = "hami-scheduler",
        extra_profiles: Sequence[Json] = (),
        extra_args: Sequence[str] = (),
        feature_gates: Mapping[str, bool] | None = None,
        *,
        kubeconfig: Path | str | None = None,
    ) -> None:
        """(Re)start kube-scheduler with profiles default-scheduler + ``scheduler_name`` (+ extras).

        Extenders are global in KubeSchedulerConfiguration v1: every profile uses them. With
        ``managedResources`` set, the scheduler only calls the extender for pods that request one of
        those resources, whatever their schedulerName. Returns when /readyz is ok (informers synced).
        ``kubeconfig`` (default: the admin's) is the scheduler's identity for its client and for
        delegated authentication/authorization, as in-cluster config is in a pod.
        """
        self._sched_setup = _SchedulerSetup(
            extender, scheduler_name, tuple(extra_profiles), tuple(extra_args), dict(feature_gates or {}),
            Path(kubeconfig) if kubeconfig is not None else None,
        )
        self.restart_scheduler()

    def scheduler_config(self) -> Json:
        """The KubeSchedulerConfiguration for the current scheduler setup."""
        setup = self._sched_setup or _SchedulerSetup(None, "hami-scheduler", (), ())
        profiles: list[Json] = [{"schedulerName": "default-scheduler"}]
        if setup.scheduler_name != "default-scheduler":
            profiles.append({"schedulerName": setup.scheduler_name})
        profiles.extend(setup.extra_profiles)
        cfg: Json = {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(setup.kubeconfig or self.kubeconfig_path), "qps": 500,
                                 "burst": 1000},
            "leaderElection": {"leaderElect": False},
            # Unset, clusters > 100 nodes are sampled and the extender sees only a subset.
            "percentageOfNodesToScore": 100,
            "profiles": profiles,
        }
        if setup.extender is not None:
            cfg["extenders"] = [setup.extender.to_config(self.ca_pem)]
        return cfg

    def restart_scheduler(self) -> None:
        """Stop the scheduler if running and start it again with the last ``start_scheduler`` setup."""
        self.stop_scheduler()
        setup = self._sched_setup or _SchedulerSetup(None, "hami-scheduler", (), ())
        self._sched_setup = setup
        config_path = self.workdir / "scheduler.yaml"
        config_path.write_text(yaml.safe_dump(self.scheduler_config(), sort_keys=False))
        self._sched_port = free_port()
        kc = str(setup.kubeconfig or self.kubeconfig_path)
        argv = [
            str(self.bin_dir / "kube-scheduler"),
            f"--config={config_path}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self._sched_port}",
            f"--cert-dir={self.workdir / 'scheduler-certs'}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            f"--v={self.scheduler_verbosity}",
        ]
        if setup.feature_gates:
            gates = ",".join(
                f"{k}={'true' if v else 'false'}" for k, v in sorted(setup.feature_gates.items())
            )
            argv.append(f"--feature-gates={gates}")
        argv.extend(setup.extra_args)
        proc = self._spawn("kube-scheduler", argv)
        insecure = ssl.create_default_context()
        # The scheduler serves a self-signed cert it generates itself; only /readyz is read here.
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE

        def ready() -> bool:
            url = f"https://127.0.0.1:{self._sched_port}/readyz"
            with urllib.request.urlopen(url, timeout=2, context=insecure) as r:
                return int(r.status) == 200

        t0 = time.monotonic()
        try:
            self._wait(proc, ready)
        except BaseException:
            self.stop_scheduler()
            raise
        self.timings["scheduler"] = time.monotonic() - t0

    def stop_scheduler(self) -> None:
        p = self._procs.pop("kube-scheduler", None)
        if p is not None:
            p.stop()

    async def start_scheduler_async(
        self,
        extender: ExtenderSpec | None = None,
        scheduler_name: str = "hami-scheduler",
        extra_profiles: Sequence[Json] = (),
        extra_args: Sequence[str] = (),
        feature_gates: Mapping[str, bool] | None = None,
        *,
        kubeconfig: Path | str | None = None,
    ) -> None:
        """start_scheduler in a thread, so an extender served by the caller's loop stays responsive."""
        await asyncio.to_thread(
            self.start_scheduler, extender, scheduler_name, extra_profiles, extra_args, feature_gates,
            kubeconfig=kubeconfig,
        )

    # ----------------------------------------------------------------------------------- webhooks
    def register_webhooks(
        self,
        mutating_url: str | None,
        validating_url: str | None = None,
        ca_pem: bytes | None = None,
        *,
        name: str = "mtsched",
        namespace_selector: Json | None = None,
        object_selector: Json | None = None,
        operations: Sequence[str] = ("CREATE",),
        failure_policy: str = "Fail",
        timeout_seconds: int = 5,
        reinvocation_policy: str = "Never",
        wait_timeout: float = 30.0,
    ) -> None:
        """Create (replace) ``{name}-mutating`` / ``{name}-validating`` configs for pods and wait until live.

        Liveness: the apiserver loads webhook configurations through an informer, so a new config
        takes effect a little later. Each config is created with an extra *canary* webhook listed
        first, served by a throwaway server in this process and scoped to the namespace
        ``mtsched-harness-canary`` (which the real webhooks' namespaceSelector always excludes).
        Dry-run pod creates in that namespace are repeated until the canary of every config was
        called: a config object is loaded atomically, so the real webhooks are live from then on.
        The canary entries are then removed. So nothing is assumed about the real webhook, which
        need not even be running yet.
        """
        if mutating_url is None and validating_url is None:
            raise ValueError("give mutating_url and/or validating_url")
        ca_b64 = base64.b64encode(ca_pem if ca_pem is not None else self.ca_pem).decode()
        self._ensure_namespace(CANARY_NAMESPACE)
        nonce = uuid.uuid4().hex
        canary = _CanaryServer(self.pki.serving_crt, self.pki.serving_key)
        thread = threading.Thread(target=canary.serve_forever, name="webhook-canary", daemon=True)
        thread.start()
        try:
            kinds: list[tuple[str, str, str]] = []  # (kind, config name, canary path)
            if mutating_url is not None:
                kinds.append(("mutating", mutating_url, f"/{nonce}/mutating"))
            if validating_url is not None:
                kinds.append(("validating", validating_url, f"/{nonce}/validating"))
            for kind, url, path in kinds:
                real: Json = {
                    "name": f"pods.{kind}.{name}.mtsched.io",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": failure_policy,
                    "timeoutSeconds": timeout_seconds,
                    "matchPolicy": "Equivalent",
                    "clientConfig": {"url": url, "caBundle": ca_b64},
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
                real["namespaceSelector"] = _exclude_canary_namespace(namespace_selector)
                if object_selector is not None:
                    real["objectSelector"] = object_selector
                if kind == "mutating":
                    real["reinvocationPolicy"] = reinvocation_policy
                probe = {
                    **real,
                    "name": f"canary.{kind}.{name}.mtsched.io",
                    "failurePolicy": "Ignore",
                    "timeoutSeconds": 2,
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{canary.port}{path}",
                        "caBundle": base64.b64encode(self.ca_pem).decode(),
                    },
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": CANARY_NAMESPACE}},
                    "rules": [{**real["rules"][0], "operations": ["CREATE"]}],
                }
                probe.pop("objectSelector", None)
                self._put_webhook_config(kind, f"{name}-{kind}", [probe, real])
            self._wait_canaries(canary, [p for _, _, p in kinds], wait_timeout)
            for kind, _, _ in kinds:
                self._drop_canary(kind, f"{name}-{kind}")
        finally:
            canary.shutdown()
            canary.server_close()

    async def register_webhooks_async(self, *args: Any, **kwargs: Any) -> None:
        """register_webhooks in a thread, so a webhook served by the caller's loop can answer."""
        await asyncio.to_thread(self.register_webhooks, *args, **kwargs)

    def unregister_webhooks(self, name: str = "mtsched") -> None:
        for kind in ("mutating", "validating"):
            self.api("DELETE", f"{_webhook_path(kind)}/{name}-{kind}", ok=(200, 202, 404))

    def _ensure_namespace(self, ns: str) -> None:
        self.api(
            "POST",
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
            ok=(201, 409),
        )

    def _put_webhook_config(self, kind: str, config_name: str, webhooks: list[Json]) -> None:
        base = _webhook_path(kind)
        self.api("DELETE", f"{base}/{config_name}", ok=(200, 202, 404))
        obj = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration"
            if kind == "mutating"
            else "ValidatingWebhookConfiguration",
            "metadata": {"name": config_name, "labels": {"app.kubernetes.io/managed-by": "mtsched-harness"}},
            "webhooks": webhooks,
        }
        self.api("POST", base, obj)

    def _wait_canaries(self, canary: _CanaryServer, paths: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"generateName": "canary-", "labels": {"mtsched.io/harness-canary": "true"}},
            "spec": {"containers": [{"name": "c", "image": "canary.invalid/none"}]},
        }
        last = ""
        while not all(canary.saw(p) for p in paths):
            if time.monotonic() > deadline:
                raise ControlPlaneError(
                    f"webhook configs not live after {timeout}s (canaries seen: "
                    f"{[p for p in paths if canary.saw(p)]}); last dry-run reply: {last[:500]}"
                )
            # Dry run: webhooks with sideEffects None are still called, nothing is stored.
            status, raw = self._http("POST", f"/api/v1/namespaces/{CANARY_NAMESPACE}/pods?dryRun=All", pod)
            last = f"{status} {raw.decode(errors='replace')}"
            if not all(canary.saw(p) for p in paths):
                time.sleep(0.1)

    def _drop_canary(self, kind: str, config_name: str) -> None:
        path = f"{_webhook_path(kind)}/{config_name}"
        obj = self.api("GET", path)
        obj["webhooks"] = [w for w in obj["webhooks"] if not w["name"].startswith("canary.")]
        self.api("PUT", path, obj)

    # --------------------------------------------------------------------------------------- etcd
    def etcd_revision(self) -> int:
        """Current etcd revision (via the etcd v3 JSON gateway; int64 values arrive as strings)."""
        status = self._etcd_post("/v3/maintenance/status", {})
        return int(status["header"]["revision"])

    def compact_etcd(self, revision: int | None = None) -> int:
        """Compact etcd history up to ``revision`` (default: current). Returns the revision.

        Watches (or lists with resourceVersion) older than it then fail with 410 Gone — when they
        reach etcd. With the watch cache on (default), the apiserver serves watches for cached
        resources from memory and answers 410 only for RVs older than its cache window, regardless
        of etcd compaction; use ``ControlPlane(watch_cache=False)`` to get etcd semantics.
        """
        rev = revision if revision is not None else self.etcd_revision()
        self._etcd_post("/v3/kv/compaction", {"revision": str(rev), "physical": True})
        return rev

    def _etcd_post(self, path: str, body: Json) -> Json:
        req = urllib.request.Request(
            self.etcd_url + path,
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                out: Json = json.load(r)
                return out
        except urllib.error.HTTPError as e:
            raise ControlPlaneError(f"etcd {path}: HTTP {e.code}: {e.read()[:500]!r}") from e


def _exclude_canary_namespace(selector: Json | None) -> Json:
    sel: Json = json.loads(json.dumps(selector or {}))  # deep copy, never mutate the caller's dict
    sel.setdefault("matchExpressions", []).append(
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": [CANARY_NAMESPACE]}
    )
    return sel


def _webhook_path(kind: str) -> str:
    plural = "mutatingwebhookconfigurations" if kind == "mutating" else "validatingwebhookconfigurations"
    return f"/apis/admissionregistration.k8s.io/v1/{plural}"
