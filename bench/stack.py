"""deploy.local.stack.Stack for the benchmark: roles started through bench.timed_role (fine latency
histograms), and kube-scheduler calling one extender the way a deployment does (`extender_tls`):

- `chart` (the default): what the chart deploys by default (scheduler.extender.scheme), today `http`;
- `http`: plain HTTP on loopback: the chart's sidecar, listening on its pod's own loopback, which only that
  pod's containers reach (deploy/helm/hami/templates/scheduler/configmap.yaml);
- `https`: the chart with scheduler.extender.scheme=https: kube-scheduler checks the extender's certificate
  and presents none (`tlsConfig` has a `caFile` only). This was `chart` before `4c2a096` (2026-12-03,
  19:10 UTC; results in bench/results/ from before then that say `chart` are this mode, docs/benchmarks.md);
- `mutual`: the local harness's mutual TLS (kube-scheduler's client certificate, extenderClientCAFile),
  which the extender needs on any address other than loopback, and the webhook asking the API server for its
  client certificate (webhookClientCAFile), which the other modes leave off as the chart does by default.

With several extender replicas, kube-scheduler calls the harness's random balancer, always over mutual TLS.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

from deploy.local.stack import NO_EXTENDER_CLIENT_CHECK, NO_WEBHOOK_CLIENT_CHECK, Role, Stack

EXTENDER_TLS = ("chart", "http", "https", "mutual")
CHART_DEFAULT = "http"  # deploy/helm/hami/values.yaml scheduler.extender.scheme


def concrete(extender_tls: str) -> str:
    """The mode an `extender_tls` option measures with one extender replica: `chart` is the chart's default."""
    return CHART_DEFAULT if extender_tls == "chart" else extender_tls


@dataclass
class BenchStack(Stack):
    extender_tls: str = "chart"

    def __post_init__(self) -> None:
        if self.extender_tls not in EXTENDER_TLS:
            raise ValueError(f"extender_tls {self.extender_tls!r}; allowed: {', '.join(EXTENDER_TLS)}")
        self.extender_tls = concrete(self.extender_tls)

    @property
    def sidecar(self) -> bool:
        """One extender that kube-scheduler calls directly (no balancer between them)."""
        return self.extenders == 1

    def _spawn(self, role: Role) -> None:
        log = open(role.log_path, "ab")  # noqa: SIM115 - the child writes it for its lifetime
        argv = self.role_argv(role, "bench.timed_role") + self.tls_argv(role.kind)  # with its chart identity
        role.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def how_called(self) -> str:
        """How kube-scheduler reaches the extender, for the benchmark's progress lines."""
        if not self.sidecar:
            return "through the balancer over mutual TLS"
        return {"https": "over HTTPS without a client certificate (the chart's sidecar, scheme https)",
                "mutual": "over mutual TLS (kube-scheduler's client certificate)",
                "http": "over plain HTTP on loopback (the chart's sidecar, scheme http)"}[self.extender_tls]

    def tls_argv(self, kind: str) -> list[str]:
        """The settings that undo the harness's TLS for the sidecar extender, and the webhook's client
        certificate check, which the chart leaves off by default (webhook.clientAuth), for `http` and `https`
        (after role_argv's, so they win)."""
        if kind == "webhook" and self.extender_tls != "mutual":
            return [*NO_WEBHOOK_CLIENT_CHECK]
        if kind != "extender" or not self.sidecar:
            return []
        if self.extender_tls == "http":  # no certificate at all (the webhook's client CA would need one)
            return ["--set", "tlsCertFile=", "--set", "tlsKeyFile=", *NO_EXTENDER_CLIENT_CHECK,
                    *NO_WEBHOOK_CLIENT_CHECK]
        if self.extender_tls == "https":  # it listens on loopback (role_argv): no client certificate asked
            return [*NO_EXTENDER_CLIENT_CHECK]
        return []

    def _scheduler_client_cert(self) -> tuple[bytes, bytes] | None:
        if self.sidecar and self.extender_tls != "mutual":
            return None
        return super()._scheduler_client_cert()

    def _front(self, kind: str) -> str:
        if kind == "extender" and self.extender_tls == "http" and self.sidecar:
            return f"http://127.0.0.1:{next(r for r in self.roles if r.kind == kind).port}"
        return super()._front(kind)
