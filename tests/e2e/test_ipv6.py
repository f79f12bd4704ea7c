"""Over IPv6, on the real control plane: every role listens on the chart's default unspecified address
(`0.0.0.0`, read as Go reads it: both families, shared/serving/http.py `listen_sockets`) and is reached only at
the IPv6 loopback `[::1]`: the API server calls the webhook there, kube-scheduler the extender (filter,
prioritize, bind), and the readiness probes and metrics are read there, as in an IPv6 or IPv6-first cluster
where the kubelet and the API server dial a pod's IPv6 address. A slice pod is admitted, placed and booked.
"""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Iterator

import pytest

from deploy.local.controlplane import ControlPlane
from deploy.local.redis import RedisServer
from deploy.local.stack import Stack
from shared.domain.annotations import ALLOCATED
from tests.e2e.test_product import CORE, MEM, VGPU, Cluster, grants

pytestmark = pytest.mark.e2e


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane, redis_server: RedisServer) -> Iterator[Stack]:
    if not _has_ipv6_loopback():
        pytest.skip("this host has no IPv6 loopback (::1)")
    with Stack(control_plane, redis_server.empty().url, "96", listen_host="0.0.0.0", dial_host="::1").running() as st:
        yield st


async def test_a_slice_pod_is_admitted_placed_and_booked_over_ipv6(cluster: Cluster, stack: Stack) -> None:
    # the only addresses the API server and kube-scheduler were given are [::1]'s
    assert stack.cp.scheduler_config()["extenders"][0]["urlPrefix"].startswith("https://[::1]:")
    node = await cluster.add_node(96, cards=2)
    created = await cluster.create(cluster.pod("v6", {VGPU: 1, MEM: 32, CORE: 4}))
    assert created["spec"]["schedulerName"] == "hami-scheduler", created["spec"]  # the webhook mutated it
    pod = (await cluster.wait_bound("v6"))["v6"]
    assert pod["spec"]["nodeName"] == node and ALLOCATED in pod["metadata"]["annotations"]  # our bind wrote it
    ((grant,),) = grants(pod)
    assert grant.memory_mib == 32 * 512 and grant.device_id.startswith(f"{node}-mthreads-")
    await cluster.wait_ledger(lambda s: any(r.pod.endswith("/v6") and r.state == "bound"
                                            for r in s[node].reservations.values()))


def test_probes_and_metrics_answer_on_both_families(stack: Stack) -> None:
    for role in stack.roles:
        for host in ("127.0.0.1", "[::1]"):
            with urllib.request.urlopen(f"http://{host}:{role.metrics_port}/readyz", timeout=5) as resp:
                assert resp.status == 200, (role.name, host)
        assert "mtsched_redis_up 1.0" in stack.metrics(role), role.name
