"""The chart's default sidecar (scheduler.extender.scheme: http) on the real control plane: kube-scheduler calls
the extender at the rendered entry's plain-HTTP URL on 127.0.0.1, and the extender runs as `mtsched extender`
with exactly the arguments the rendered chart gives its container. A slice pod is placed with its allocation
record and booked; the port speaks no TLS; and the same arguments on a non-loopback address refuse to start.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from deploy.local.controlplane import ControlPlane
from deploy.local.redis import RedisServer
from deploy.local.stack import NO_EXTENDER_CLIENT_CHECK, NO_WEBHOOK_CLIENT_CHECK, Role, Stack
from shared.domain.annotations import ALLOCATED
from tests.deploy._chart import Json, embedded, objects, one
from tests.e2e._chart import rendered
from tests.e2e.test_product import CORE, MEM, VGPU, Cluster

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
# the harness config's client checks (deploy/local/stack.py write_config), which the chart's extender has not
HARNESS_ONLY = (*NO_EXTENDER_CLIENT_CHECK, *NO_WEBHOOK_CLIENT_CHECK)


@dataclass(frozen=True)
class ChartSidecar:
    url_prefix: str  # the rendered KubeSchedulerConfiguration's extender entry
    args: tuple[str, ...]  # the extender container's `--set=tls...` arguments


@pytest.fixture(scope="module")
def sidecar(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> ChartSidecar:
    objs: list[Json] = objects(rendered(pytestconfig, tmp_path_factory, "sidecar.yaml").read_text())
    (entry,) = embedded(objs, "hami-scheduler", "scheduler-config.yaml")["extenders"]
    pod = one(objs, "Deployment", "hami-scheduler")["spec"]["template"]["spec"]
    ext = next(c for c in pod["containers"] if c["name"] == "extender")
    assert "--set=listen=127.0.0.1:8443" in ext["args"]
    return ChartSidecar(entry["urlPrefix"], tuple(a for a in ext["args"] if a.startswith("--set=tls")))


@dataclass
class SidecarStack(Stack):
    """One extender that kube-scheduler reaches at the chart's URL scheme on 127.0.0.1, started with the chart's
    TLS arguments. The harness's one config asks for kube-scheduler's client certificate (every role here shares
    this machine's loopback) and names the webhook's client CA; the chart gives the extender neither."""

    chart: ChartSidecar | None = None

    def role_argv(self, role: Role, module: str = "controller.cli") -> list[str]:
        argv = super().role_argv(role, module)
        if role.kind == "extender" and self.chart is not None:
            argv += [*HARNESS_ONLY, *self.chart.args]
        return argv

    def _scheduler_client_cert(self) -> tuple[bytes, bytes] | None:
        return None

    def _front(self, kind: str) -> str:
        if kind == "extender" and self.chart is not None:
            scheme = self.chart.url_prefix.split("://")[0]
            return f"{scheme}://127.0.0.1:{self.role('extender').port}"
        return super()._front(kind)


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane, redis_server: RedisServer, sidecar: ChartSidecar) -> Iterator[Stack]:
    with SidecarStack(control_plane, redis_server.empty().url, "96", chart=sidecar).running() as st:
        yield st


def test_the_chart_renders_plain_http_and_no_certificate(sidecar: ChartSidecar) -> None:
    assert sidecar.url_prefix == "http://127.0.0.1:8443"
    assert sidecar.args == ("--set=tlsCertFile=", "--set=tlsKeyFile=")


async def test_kube_scheduler_places_a_pod_through_the_plain_http_sidecar(cluster: Cluster, stack: Stack) -> None:
    node = await cluster.add_node(96, cards=2)
    await cluster.create(cluster.pod("sliced", {VGPU: 1, MEM: 32, CORE: 4}))
    pod = (await cluster.wait_bound("sliced"))["sliced"]
    assert pod["spec"]["nodeName"] == node
    assert ALLOCATED in pod["metadata"]["annotations"]  # written by our bind, with the Binding
    await cluster.wait_ledger(lambda s: any(r.pod.endswith("/sliced") and r.state == "bound"
                                            for r in s[node].reservations.values()))
    assert f"listening on http://127.0.0.1:{stack.role('extender').port}" in stack.tail(stack.role("extender"), 400)


def test_the_sidecar_port_speaks_no_tls(stack: Stack) -> None:
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", stack.role("extender").port), timeout=5) as raw, \
            pytest.raises(ssl.SSLError), ctx.wrap_socket(raw):
        pass


def test_the_charts_arguments_off_loopback_refuse_to_start(stack: Stack, sidecar: ChartSidecar) -> None:
    """Plain HTTP is for the pod's own loopback: on any other address the extender does not start (exit 2)."""
    argv = [sys.executable, "-m", "controller.cli", "extender", "--config", str(stack.config_path),
            *HARNESS_ONLY, *sidecar.args,
            "--set", "listen=0.0.0.0:0", "--set", "metricsListen=127.0.0.1:0"]
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "is not a loopback address" in out.stdout + out.stderr
    assert yaml.safe_load(stack.config_path.read_text())["tlsCertFile"]  # the harness's config had a certificate
