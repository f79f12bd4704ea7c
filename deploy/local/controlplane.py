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
import contextlib
import functools
import json
import os
import shutil
import ssl
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import yaml

from deploy.local import apiserver, etcd, webhooks
from deploy.local.apiserver import ADMIN_TOKEN_USER
from deploy.local.binaries import BIN_DIR_ENV, BINARIES, BUILD_SCRIPT, BuildError, ensure_binaries, go_available
from deploy.local.errors import ApiError, ControlPlaneError
from deploy.local.pki import PkiPaths, write_pki
from deploy.local.processes import (
    Proc,
    default_workdir_parent,
    free_port,
    port_taken,
    spawn,
    tail,
    wait_ready,
)
from deploy.local.scheduler_config import (
    ExtenderSpec,
    SchedulerSetup,
    scheduler_argv,
    scheduler_config,
    scheduler_ready,
)
from deploy.local.webhooks import CANARY_NAMESPACE, CanaryServer

# Imported from here by the tests, the stack, the quick start and the benchmarks.
__all__ = [
    "ADMIN_TOKEN_USER", "BINARIES", "BIN_DIR_ENV", "BUILD_SCRIPT", "CANARY_NAMESPACE", "ApiError", "BuildError",
    "ControlPlane", "ControlPlaneError", "ExtenderSpec", "ensure_binaries", "free_port", "go_available",
]

Json = dict[str, Any]
P = ParamSpec("P")
R = TypeVar("R")


def in_thread(fn: Callable[P, R]) -> Callable[P, Coroutine[Any, Any, R]]:
    """The async twin of a blocking method, same arguments: runs it in a thread, so that a server living
    in the caller's event loop (an extender, a webhook) can answer the calls the method waits for."""

    async def run(*args: P.args, **kwargs: P.kwargs) -> R:
        return await asyncio.to_thread(fn, *args, **kwargs)

    run.__name__, run.__doc__ = f"{fn.__name__}_async", f"{fn.__name__} in a thread (in_thread)."
    return run


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
        self._procs: dict[str, Proc] = {}
        self._pki: PkiPaths | None = None
        self._etcd_port = 0
        self._api_port = 0
        self._sched_port = 0
        self._sched_setup: SchedulerSetup | None = None
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

    @functools.cached_property
    def scheduler_version(self) -> str:
        """`kube-scheduler --version` of this plane's binary ("Kubernetes v1.36.3"): the chart derives nudgeAnyNode
        from its kube-scheduler's version, the stack from this one (shared/domain/nudge.py)."""
        out = subprocess.run([str(self.bin_dir / "kube-scheduler"), "--version"], capture_output=True, text=True,
                             timeout=30, check=False)
        return out.stdout.strip()

    @functools.cached_property
    def apiserver_version(self) -> str:
        """`kube-apiserver --version` of this plane's binary ("Kubernetes v1.36.3")."""
        out = subprocess.run([str(self.bin_dir / "kube-apiserver"), "--version"], capture_output=True, text=True,
                             timeout=30, check=False)
        return out.stdout.strip()

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
            self._workdir = Path(tempfile.mkdtemp(prefix="mtsched-cp-", dir=default_workdir_parent()))
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
        """The last lines of every component log (the plane's and, below it, the roles' of the stacks run on
        it), for failure reports."""
        if self._workdir is None:
            return ""
        parts = []
        for log in sorted(self.workdir.rglob("*.log")):
            parts.append(f"===== {log} (last {lines} lines) =====\n{tail(log, lines)}")
        return "\n".join(parts)

    def _spawn(self, name: str, argv: list[str]) -> Proc:
        proc = spawn(self.workdir, name, argv)
        self._procs[name] = proc
        return proc

    def _wait(self, proc: Proc, ready: Callable[[], bool], timeout: float | None = None) -> None:
        wait_ready(proc, ready, timeout or self.start_timeout)

    def _write_auth_files(self) -> None:
        (self.workdir / "tokens.csv").write_text(apiserver.token_file(self.token))
        kubeconfig = self.workdir / "webhook-client.kubeconfig"
        kubeconfig.write_text(yaml.safe_dump(apiserver.webhook_client_kubeconfig(self.pki), sort_keys=False))
        kubeconfig.chmod(0o600)
        self.admission_config_path.write_text(yaml.safe_dump(apiserver.admission_config(kubeconfig), sort_keys=False))

    @property
    def admission_config_path(self) -> Path:
        """Who the API server is to the webhooks it calls (deploy/local/apiserver.py admission_config)."""
        return self.workdir / "admission.yaml"

    def _write_kubeconfig(self) -> None:
        kc = apiserver.admin_kubeconfig(self.server_url, self.ca_pem, self.token)
        self.kubeconfig_path.write_text(yaml.safe_dump(kc, sort_keys=False))
        self.kubeconfig_path.chmod(0o600)

    def _start_etcd(self, bin_dir: Path) -> None:
        def once(attempt: int) -> None:
            self._etcd_port = free_port()
            data = self.workdir / ("etcd" if attempt == 0 else f"etcd-{attempt}")  # a member afresh
            proc = self._spawn("etcd", etcd.etcd_argv(bin_dir / "etcd", data, self.etcd_url, free_port()))
            self._wait(proc, lambda: etcd.etcd_healthy(self.etcd_url))

        self._on_free_ports("etcd", once)

    def _on_free_ports(self, name: str, once: Callable[[int], None]) -> None:
        """``once(attempt)`` starts component ``name`` on ports it picks; it is started again (3 attempts) while
        it exits because a port it was given was taken before it bound it (nothing points at them yet). The
        failed attempt's log is kept beside, still a .log (log_tails), never over an earlier one."""
        for attempt in range(3):
            try:
                once(attempt)
                return
            except ControlPlaneError:
                proc = self._procs[name]
                if attempt == 2 or proc.alive() or not port_taken(tail(proc.log_path, 40)):
                    raise
                with contextlib.suppress(OSError):
                    proc.log_path.rename(proc.log_path.with_suffix(f".port-taken-{time.time_ns()}.log"))

    def restart_apiserver(self) -> None:
        """Stop kube-apiserver and start it again on the same port and etcd: every watch stream and
        connection is cut, and clients must resume (fault tests)."""
        p = self._procs.pop("kube-apiserver", None)
        if p is not None:
            p.stop()
        self._start_apiserver(self.bin_dir, port=self._api_port)

    def _start_apiserver(self, bin_dir: Path, port: int = 0) -> None:
        if port:  # a restart keeps its port (clients point at it): only a first start may move
            self._start_apiserver_once(bin_dir, port)
        else:
            self._on_free_ports("kube-apiserver", lambda _: self._start_apiserver_once(bin_dir, 0))

    def _start_apiserver_once(self, bin_dir: Path, port: int) -> None:
        self._api_port = port or free_port()
        argv = apiserver.apiserver_argv(
            bin_dir / "kube-apiserver", self.etcd_url, self._api_port, self.pki, self.workdir / "tokens.csv",
            watch_cache=self.watch_cache, verbosity=self.apiserver_verbosity,
            extra=(*apiserver.version_args(self.apiserver_version), *self.extra_apiserver_args),
            admission=self.admission_config_path,
        )
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
        return apiserver.admin_request(self.server_url + path, self.token, self._client_ctx, method, body,
                                       content_type=content_type, timeout=timeout)

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
        self._sched_setup = SchedulerSetup(
            extender, scheduler_name, tuple(extra_profiles), tuple(extra_args), dict(feature_gates or {}),
            Path(kubeconfig) if kubeconfig is not None else None,
        )
        self.restart_scheduler()

    def scheduler_config(self) -> Json:
        """The KubeSchedulerConfiguration for the current scheduler setup."""
        setup = self._sched_setup or SchedulerSetup(None, "hami-scheduler", (), ())
        return scheduler_config(setup, setup.kubeconfig or self.kubeconfig_path, self.ca_pem)

    def restart_scheduler(self) -> None:
        """Stop the scheduler if running and start it again with the last ``start_scheduler`` setup."""
        self.stop_scheduler()
        setup = self._sched_setup or SchedulerSetup(None, "hami-scheduler", (), ())
        self._sched_setup = setup
        config_path = self.workdir / "scheduler.yaml"
        config_path.write_text(yaml.safe_dump(self.scheduler_config(), sort_keys=False))
        t0 = time.monotonic()

        def once(_: int) -> None:
            self._sched_port = free_port()
            argv = scheduler_argv(self.bin_dir / "kube-scheduler", config_path, self._sched_port,
                                  self.workdir / "scheduler-certs", setup.kubeconfig or self.kubeconfig_path,
                                  self.scheduler_verbosity, setup)
            proc = self._spawn("kube-scheduler", argv)
            self._wait(proc, lambda: scheduler_ready(self._sched_port))

        try:
            self._on_free_ports("kube-scheduler", once)
        except BaseException:
            self.stop_scheduler()
            raise
        self.timings["scheduler"] = time.monotonic() - t0

    def stop_scheduler(self) -> None:
        p = self._procs.pop("kube-scheduler", None)
        if p is not None:
            p.stop()

    start_scheduler_async = in_thread(start_scheduler)  # an in-loop extender stays responsive meanwhile

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
        hook_name: str | None = None,
    ) -> None:
        """Create (replace) ``{name}-mutating`` / ``{name}-validating`` configs for pods and wait until live.
        ``hook_name`` names the real webhook of each (default ``pods.{kind}.{name}.mtsched.io``).

        Liveness is proven by canary webhooks (deploy/local/webhooks.py), removed again once called:
        nothing is assumed about the real webhook, which need not even be running yet.
        """
        if mutating_url is None and validating_url is None:
            raise ValueError("give mutating_url and/or validating_url")
        self._ensure_namespace(CANARY_NAMESPACE)
        nonce = uuid.uuid4().hex
        canary = CanaryServer(self.pki.serving_crt, self.pki.serving_key)
        thread = threading.Thread(target=canary.serve_forever, name="webhook-canary", daemon=True)
        thread.start()
        try:
            kinds: list[tuple[str, str, str]] = []  # (kind, config name, canary path)
            if mutating_url is not None:
                kinds.append(("mutating", mutating_url, f"/{nonce}/mutating"))
            if validating_url is not None:
                kinds.append(("validating", validating_url, f"/{nonce}/validating"))
            for kind, url, path in kinds:
                hooks = webhooks.webhooks_with_canary(
                    kind, name, url, ca_pem if ca_pem is not None else self.ca_pem,
                    f"https://127.0.0.1:{canary.port}{path}", self.ca_pem,
                    namespace_selector=namespace_selector, object_selector=object_selector, operations=operations,
                    failure_policy=failure_policy, timeout_seconds=timeout_seconds,
                    reinvocation_policy=reinvocation_policy, hook_name=hook_name,
                )
                self._put_webhook_config(kind, f"{name}-{kind}", hooks)
            # Dry run: webhooks with sideEffects None are still called, nothing is stored.
            webhooks.wait_for_canaries(canary, [p for _, _, p in kinds], wait_timeout, lambda: self._http(
                "POST", f"/api/v1/namespaces/{CANARY_NAMESPACE}/pods?dryRun=All", webhooks.CANARY_POD))
            for kind, _, _ in kinds:
                self._drop_canary(kind, f"{name}-{kind}")
        finally:
            canary.shutdown()
            canary.server_close()

    register_webhooks_async = in_thread(register_webhooks)  # an in-loop webhook can answer meanwhile

    def unregister_webhooks(self, name: str = "mtsched") -> None:
        for kind in ("mutating", "validating"):
            self.api("DELETE", f"{webhooks.webhook_path(kind)}/{name}-{kind}", ok=(200, 202, 404))

    def _ensure_namespace(self, ns: str) -> None:
        self.api(
            "POST",
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
            ok=(201, 409),
        )

    def _put_webhook_config(self, kind: str, config_name: str, hooks: list[Json]) -> None:
        base = webhooks.webhook_path(kind)
        self.api("DELETE", f"{base}/{config_name}", ok=(200, 202, 404))
        self.api("POST", base, webhooks.webhook_configuration(kind, config_name, hooks))

    def _drop_canary(self, kind: str, config_name: str) -> None:
        path = f"{webhooks.webhook_path(kind)}/{config_name}"
        self.api("PUT", path, webhooks.without_canaries(self.api("GET", path)))

    # --------------------------------------------------------------------------------------- etcd
    def etcd_revision(self) -> int:
        """Current etcd revision (via the etcd v3 JSON gateway; int64 values arrive as strings)."""
        return etcd.etcd_revision(self.etcd_url)

    def compact_etcd(self, revision: int | None = None) -> int:
        """Compact etcd history up to ``revision`` (default: current). Returns the revision.

        Watches (or lists with resourceVersion) older than it then fail with 410 Gone — when they
        reach etcd. With the watch cache on (default), the apiserver serves watches for cached
        resources from memory and answers 410 only for RVs older than its cache window, regardless
        of etcd compaction; use ``ControlPlane(watch_cache=False)`` to get etcd semantics.
        """
        rev = revision if revision is not None else self.etcd_revision()
        etcd.compact_etcd(self.etcd_url, rev)
        return rev
