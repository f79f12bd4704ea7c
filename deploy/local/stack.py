"""Our three roles as real processes beside a local control plane and Redis, wired as in production.

The extender and webhook replicas serve HTTPS with the harness serving certificate; with more than
one replica a per-request random balancer sits in front (what a Service does in a cluster).
kube-scheduler gets the `hami-scheduler` profile calling the extender; the apiserver gets a
MutatingWebhookConfiguration pointing at the webhook. Used by the e2e tests, the quick start and
the benchmarks.

Every role, kube-scheduler included, runs as the ServiceAccount the chart gives it, with the
chart's RBAC and admission policy from the rendered manifest (deploy/local/identities.py), never as
the admin: a permission the chart lacks fails here as it would in a cluster. Redis requires a
password: a password in `redis_url` (RedisServer.url) reaches the roles as `redisPasswordFile`, a
file of the stack's (0600, as a mounted Secret would be), never in their config file or logs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from deploy.local.controlplane import ControlPlane, ExtenderSpec
from deploy.local.identities import (
    MANIFEST,
    Identities,
    deprovision,
    provision,
    restore_policies,
    suspend_policies,
)
from deploy.local.pki import APISERVER_CLIENT, SCHEDULER_CLIENT
from deploy.local.processes import port_taken
from deploy.local.redis import free_port, terminate
from shared.config import url_password, without_password
from shared.domain.nudge import any_node_wakes, unschedulable_retry_args
from shared.serving.http import join_addr

# Namespaces labelled so are never sent to the webhook (the benchmark's plain baseline). A namespace label,
# never a pod label: labels are set by whoever creates the object, and a pod creator must not be able to
# skip admission (nor can a tenant label its namespace: Namespaces are cluster-scoped objects).
WEBHOOK_NAMESPACE_SELECTOR = {"matchExpressions": [{"key": "mtsched.io/webhook", "operator": "NotIn",
                                                    "values": ["ignore"]}]}
# The chart's name for our webhook (HAMi's, templates/webhook/mutatingwebhook.yaml; tests/deploy/test_chart.py
# holds them equal): what `admission webhook "..." denied the request` quotes.
CHART_WEBHOOK_NAME = "vgpu.hami.io"


# `--set`s that undo the client-certificate checks write_config gives every role here (all of them share this
# machine's loopback), for a role started as the chart starts it: the extender sidecar asks for no client
# certificate, and the webhook, by default, none either (webhook.clientAuth)
NO_EXTENDER_CLIENT_CHECK = ("--set", "extenderClientCAFile=", "--set", "extenderClientNames=")
NO_WEBHOOK_CLIENT_CHECK = ("--set", "webhookClientCAFile=", "--set", "webhookClientNames=")


@dataclass
class Role:
    kind: str
    index: int
    port: int
    metrics_port: int
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)  # extra environment (fault tests: a skewed clock)

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.index}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class Stack:
    cp: ControlPlane
    redis_url: str
    memory_per_card: str = "96,160"
    extenders: int = 1
    webhooks: int = 1
    watchers: int = 1
    settings: Mapping[str, object] = field(default_factory=dict)
    workdir: Path | None = None
    # Where the ServiceAccounts and RBAC come from: the chart rendered with its defaults.
    manifest: Path = MANIFEST
    identities: Identities | None = None
    roles: list[Role] = field(default_factory=list)
    balancers: dict[str, tuple[subprocess.Popen[bytes], int]] = field(default_factory=dict)
    _webhooks_registered: bool = field(default=False, repr=False)
    # Where the roles listen (their `listen` and `metricsListen` hosts) and the address their callers dial
    # (kube-scheduler, the API server, the probes): "0.0.0.0" and "::1" test a chart default reached over IPv6.
    listen_host: str = "127.0.0.1"
    dial_host: str = "127.0.0.1"

    def url(self, port: int, scheme: str = "https") -> str:
        """A role's (or a balancer's) URL as its callers dial it."""
        return f"{scheme}://{join_addr(self.dial_host, port)}"

    @property
    def dir(self) -> Path:
        d = self.workdir or (self.cp.workdir / "stack")
        d.mkdir(parents=True, exist_ok=True)
        return d

    @property
    def config_path(self) -> Path:
        return self.dir / "mtsched.yaml"

    def write_config(self) -> None:
        doc: dict[str, object] = {
            "memoryPerCard": [int(x) for x in str(self.memory_per_card).split(",")],
            # the password goes to a file of the stack's (0600), as a mounted Secret would, never into this one
            "redisUrl": without_password(self.redis_url),
            # No kubeconfig here: each role gets its own identity's on its command line (role_argv).
            "tlsCertFile": str(self.cp.pki.serving_crt),
            "tlsKeyFile": str(self.cp.pki.serving_key),
            # the extender accepts only kube-scheduler's client certificate, the webhook only the API server's
            # (mTLS; one CA signs every certificate here, so the names narrow it to the one caller)
            "extenderClientCAFile": str(self.cp.pki.ca_crt),
            "extenderClientNames": [SCHEDULER_CLIENT],
            "webhookClientCAFile": str(self.cp.pki.ca_crt),
            "webhookClientNames": [APISERVER_CLIENT],
            "pendingTTLSeconds": 30,
            # as the chart derives it from its kube-scheduler's tag: from this plane's (shared/domain/nudge.py)
            "nudgeAnyNode": any_node_wakes(self.cp.scheduler_version),
            **self.settings,
        }
        password = url_password(self.redis_url)
        if password and "redisPasswordFile" not in self.settings and "redisPassword" not in self.settings:
            path = self.dir / "redis-password"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(password)
            doc["redisPasswordFile"] = str(path)
        self.config_path.write_text(yaml.safe_dump(doc))

    def provision(self) -> Identities:
        """The chart's ServiceAccounts and RBAC in the plane, one kubeconfig per role (once per stack)."""
        if self.identities is None:
            self.identities = provision(self.cp, self.manifest, self.dir / "identities")
        return self.identities

    @contextlib.contextmanager
    def policy_suspended(self) -> Iterator[None]:
        """Without the chart's admission policy for a while (a cluster older than Kubernetes 1.30, or one
        that turned it off): tests of what the ledger does with records the policy would refuse."""
        ids = self.provision()
        suspend_policies(self.cp, ids)
        try:
            yield
        finally:
            restore_policies(self.cp, ids)

    def kubeconfig(self, kind: str) -> Path:
        return self.provision()[kind].kubeconfig

    def role_argv(self, role: Role, module: str = "controller.cli") -> list[str]:
        ident = self.provision()[role.kind]
        # A role whose chart pod mounts no token (the webhook with mtsched.quotaCheck: false) runs without
        # credentials and, as the chart's config then says, without the quota check.
        access = ["--set", f"kubeconfig={ident.kubeconfig}"] if ident.token else ["--set", "quotaCheck=false"]
        return [sys.executable, "-m", module, role.kind, "--config", str(self.config_path),
                "--set", f"listen={join_addr(self.listen_host, role.port)}",
                "--set", f"metricsListen={join_addr(self.listen_host, role.metrics_port)}",
                *access, "--log-format", "text"]

    def _spawn(self, role: Role) -> None:
        log = open(role.log_path, "ab")  # noqa: SIM115 - the child writes it for its lifetime
        role.proc = subprocess.Popen(self.role_argv(role), stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1", **role.env})

    def _wait_ready(self, role: Role, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        url = self.url(role.metrics_port, "http") + "/readyz"
        while time.monotonic() < deadline:
            if not role.alive():
                raise RuntimeError(f"{role.name} exited:\n{self.tail(role)}")
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{role.name} not ready after {timeout}s:\n{self.tail(role)}")

    def tail(self, role: Role, lines: int = 30) -> str:
        try:
            return "\n".join(role.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def logs(self, lines: int = 30) -> str:
        return "\n".join(f"--- {r.name} ---\n{self.tail(r, lines)}" for r in self.roles)

    def start_roles(self) -> None:
        self.provision()
        self.write_config()
        counts = (("watcher", self.watchers), ("extender", self.extenders), ("webhook", self.webhooks))
        for kind, n in counts:
            for i in range(n):
                if not any(r.kind == kind and r.index == i for r in self.roles):
                    self.roles.append(Role(kind, i, free_port(), free_port(), self.dir / f"{kind}-{i}.log"))
        for role in self.roles:
            if not role.alive():
                self._spawn(role)
        for role in self.roles:
            for attempt in range(3):
                try:
                    self._wait_ready(role)
                    break
                except RuntimeError:
                    # free_port() releases the port it found; another process on this machine may take it
                    # before the role binds it: pick new ports and start again (nothing points at them yet)
                    if attempt == 2 or role.alive() or not port_taken(self.tail(role, 60)):
                        raise
                    role.port, role.metrics_port = free_port(), free_port()
                    self._spawn(role)

    def _scheduler_client_cert(self) -> tuple[bytes, bytes] | None:
        """kube-scheduler's client certificate and key for the extender (PEM); None: it presents none."""
        return self.cp.pki.client_crt.read_bytes(), self.cp.pki.client_key.read_bytes()

    def _front(self, kind: str) -> str:
        replicas = [r for r in self.roles if r.kind == kind]
        if len(replicas) == 1:
            return self.url(replicas[0].port)
        if kind not in self.balancers:
            port = free_port()
            log = open(self.dir / f"balancer-{kind}.log", "ab")  # noqa: SIM115
            argv = [sys.executable, "-m", "deploy.local.balancer", "--listen", join_addr(self.listen_host, port),
                    "--cert", str(self.cp.pki.serving_crt), "--key", str(self.cp.pki.serving_key),
                    "--ca", str(self.cp.pki.ca_crt)]
            for r in replicas:
                argv += ["--backend", self.url(r.port)]
            pki = self.cp.pki
            # mTLS on both sides, as kube-scheduler -> extender and kube-apiserver -> webhook: the balancer
            # presents the caller's certificate to the replicas, so it admits only that caller's name itself
            name, crt, key = ((SCHEDULER_CLIENT, pki.client_crt, pki.client_key) if kind == "extender"
                              else (APISERVER_CLIENT, pki.webhook_client_crt, pki.webhook_client_key))
            argv += ["--client-ca", str(pki.ca_crt), "--client-name", name, "--client-cert", str(crt),
                     "--client-key", str(key)]
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            self.balancers[kind] = (proc, port)
            ctx = ssl.create_default_context(cafile=str(self.cp.pki.ca_crt))
            ctx.load_cert_chain(crt, key)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                try:
                    urllib.request.urlopen(self.url(port) + "/_balancer/stats", timeout=2, context=ctx)
                    break
                except (urllib.error.URLError, OSError):
                    time.sleep(0.1)
        return self.url(self.balancers[kind][1])

    def start(self) -> Stack:
        self.start_roles()
        # kube-scheduler shares the extender's pod, hence its ServiceAccount.
        # kube-scheduler authenticates to the extender with a client certificate (mTLS): here every role
        # listens on this machine's loopback, which any local process reaches (in the chart, the extender's
        # loopback is its own pod's), so the extender asks for one (extenderClientCAFile), as it must off loopback
        cert = self._scheduler_client_cert()
        spec = ExtenderSpec(self._front("extender"), client_cert_pem=cert[0] if cert else None,
                            client_key_pem=cert[1] if cert else None)
        # the arguments the chart gives a kube-scheduler of this plane's version (hami.kubeSchedulerArgs)
        self.cp.start_scheduler(spec, extra_args=unschedulable_retry_args(self.cp.scheduler_version),
                                kubeconfig=self.kubeconfig("kube-scheduler"))
        # under the chart's webhook name (HAMi's), so refusals read here as they do in a cluster
        self.cp.register_webhooks(self._front("webhook") + "/mutate", ca_pem=self.cp.ca_pem,
                                  namespace_selector=WEBHOOK_NAMESPACE_SELECTOR, hook_name=CHART_WEBHOOK_NAME)
        self._webhooks_registered = True
        return self

    @contextlib.contextmanager
    def running(self) -> Iterator[Stack]:
        """Started for the `with` block and stopped after it, also when starting fails halfway (roles
        spawned, identities provisioned, the scheduler up): `with Stack(...).running() as st: yield st`."""
        try:
            yield self.start()
        finally:
            self.stop()

    def restart(self, kind: str, index: int = 0) -> None:
        role = next(r for r in self.roles if r.kind == kind and r.index == index)
        self._stop(role)
        self._spawn(role)
        self._wait_ready(role)

    def _stop(self, role: Role) -> None:
        terminate(role.proc)

    def metrics(self, role: Role) -> str:
        """The role's /metrics text."""
        with urllib.request.urlopen(self.url(role.metrics_port, "http") + "/metrics", timeout=5) as resp:
            return str(resp.read().decode())

    def role(self, kind: str, index: int = 0) -> Role:
        return next(r for r in self.roles if r.kind == kind and r.index == index)

    def kill(self, kind: str, index: int = 0) -> None:
        """SIGKILL one role's process, as a crash or the OOM killer would, and reap it."""
        proc = self.role(kind, index).proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)

    def respawn(self, kind: str, index: int = 0, env: Mapping[str, str] | None = None) -> None:
        """Start a stopped or killed role again (what the kubelet does) and wait until it is ready."""
        role = self.role(kind, index)
        if env is not None:
            role.env = dict(env)
        if role.alive():
            self._stop(role)
        self._spawn(role)
        self._wait_ready(role)

    def stop_roles(self) -> None:
        for role in self.roles:
            self._stop(role)
        for proc, _ in self.balancers.values():
            terminate(proc)
        self.balancers.clear()
        self.roles.clear()

    def stop(self) -> None:
        if self._webhooks_registered:
            # a stopped stack must not leave the API server calling its dead webhook (failurePolicy Fail):
            # every later pod create on this plane would fail with 500
            self._webhooks_registered = False
            with contextlib.suppress(Exception):
                self.cp.unregister_webhooks()
        self.stop_roles()
        if self.identities is not None:
            # kube-scheduler runs on a token of this stack's: it stops before the token is revoked.
            self.cp.stop_scheduler()
            deprovision(self.cp, self.identities)
            self.identities = None
