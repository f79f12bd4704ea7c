"""The extender beside the leader kube-scheduler hands the leadership over while it cannot do its job and another
replica can (controller/leadership.py), on a real API server and a real kube-scheduler electing its leader on the
chart's Lease under the chart's identity: nothing is written while a condition fails (ready, not the holder, no
Ready replica); once written, the Lease admission policy lets the write through, the kube-scheduler that held it
gives up at its renew deadline and exits, and another kube-scheduler takes the Lease once the written record
lapses. A readiness probe alone moves no Lease: before this, an extender of the leader pod cut off from Redis failed
every GPU pod for as long as the fault lasted, a ready replica standing by."""

from __future__ import annotations

import dataclasses
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.leadership import LeaderYield
from deploy.local.controlplane import ControlPlane, free_port
from deploy.local.identities import Identities
from deploy.local.scheduler_config import SchedulerSetup, scheduler_argv
from shared.domain.leadership import yielded_holder
from shared.kube import Kube
from tests.e2e.test_preempt import until
from tests.unit._servers import CFG

pytestmark = pytest.mark.e2e

LEASE = "hami-scheduler"  # the chart's schedulerName: the only Lease its identity may write
HOST = socket.gethostname()  # kube-scheduler names itself <hostname>_<uuid>; in a pod the hostname is its name


class Elector:
    """One kube-scheduler process electing its leader on the chart's Lease, as the chart's identity."""

    def __init__(self, cp: ControlPlane, ids: Identities, work: Path) -> None:
        ident = ids["kube-scheduler"]
        config = {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
                  "clientConnection": {"kubeconfig": str(ident.kubeconfig)},
                  # short, to keep the test short; the chart's are kube-scheduler's defaults (15 s, 10 s, 2 s)
                  "leaderElection": {"leaderElect": True, "resourceLock": "leases", "resourceName": LEASE,
                                     "resourceNamespace": ident.namespace, "leaseDuration": "6s",
                                     "renewDeadline": "4s", "retryPeriod": "1s"},
                  "profiles": [{"schedulerName": f"yield-probe-{uuid.uuid4().hex[:6]}"}]}  # schedules nothing
        work.mkdir(parents=True, exist_ok=True)
        path = work / "scheduler.yaml"
        path.write_text(yaml.safe_dump(config))
        argv = scheduler_argv(cp.bin_dir / "kube-scheduler", path, free_port(), work / "certs", ident.kubeconfig, 2,
                              SchedulerSetup(None, "unused", (), ()))
        self.log = work / "kube-scheduler.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture
def electors(control_plane: ControlPlane, ids: Identities, tmp_path: Path) -> Iterator[list[Elector]]:
    made: list[Elector] = []
    try:
        yield made
    finally:
        for e in made:
            e.stop()


async def test_the_leaders_extender_hands_the_lease_over_to_a_ready_replica(
        control_plane: ControlPlane, ids: Identities, admin: Kube, extender_kube: Kube, electors: list[Elector],
        tmp_path: Path) -> None:
    ns = ids["extender"].namespace
    lease_path = f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{LEASE}"
    await admin.request("DELETE", lease_path, ok=(200, 404))  # (another test's Lease)
    electors.append(Elector(control_plane, ids, tmp_path / "first"))

    async def holder() -> str:
        got = await admin.request("GET", lease_path, ok=(200, 404))
        return str((got.get("spec") or {}).get("holderIdentity") or "")

    first = await until("the first kube-scheduler leads", lambda: _held(holder, HOST + "_"), timeout=60)
    peers = f"yield-peer-{uuid.uuid4().hex[:6]}"
    cfg = dataclasses.replace(CFG, leader_yield_seconds=60, leader_lease=f"{ns}/{LEASE}", leader_peers=f"app={peers}",
                              pod_name=HOST)
    now = [0.0]
    problems: list[str] = []
    yielder = LeaderYield(cfg, extender_kube, lambda: problems, clock=lambda: now[0])
    assert await yielder.check() == ""  # ready: nothing
    problems.append("redis: Redis: not reachable (the test's cut)")
    assert await yielder.check() == ""  # unready from now on ...
    now[0] += 59
    assert await yielder.check() == ""  # ... not yet for 60 s
    now[0] += 2
    assert await yielder.check() == ""  # no other replica is Ready
    peer = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": peers, "namespace": ns, "labels": {"app": peers}},
            "spec": {"schedulerName": "nobody", "containers": [{"name": "c", "image": "x"}]}}
    await admin.request("POST", f"/api/v1/namespaces/{ns}/pods", peer)
    try:
        assert await yielder.check() == ""  # a replica's pod, not Ready (no kubelet here: its status is ours to set)
        status = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
        await admin.request("PATCH", f"/api/v1/namespaces/{ns}/pods/{peers}/status", status,
                            content_type="application/merge-patch+json")
        assert yielder.pod != first  # (the holder is this host's kube-scheduler, <host>_<uuid>)
        reason = await yielder.check()
        assert "while 1 other replica(s) are Ready" in reason, reason
        assert await holder() == yielded_holder(HOST)  # written as the extender's identity: the policy let it
        # the kube-scheduler that held the Lease gives up at its renew deadline and exits, as when it loses it
        await until("the leader kube-scheduler exits", lambda: _exited(electors[0]), timeout=30)
        assert electors[0].proc.returncode == 1
        assert "Leaderelection lost" in electors[0].log.read_text(errors="replace")
        # another kube-scheduler (a ready replica's) takes the Lease once the written record lapses
        electors.append(Elector(control_plane, ids, tmp_path / "second"))
        second = await until("another kube-scheduler leads", lambda: _held(holder, HOST + "_"), timeout=60)
        assert second != first
        # its kube-scheduler holds the Lease now and the extender is still unready: not again before 60 s more
        assert await yielder.check() == ""
        events = await admin.request("GET", f"/api/v1/namespaces/{ns}/events",
                                     query={"fieldSelector": f"involvedObject.name={HOST}"})
        assert any(e.get("reason") == "LeadershipYielded" for e in events.get("items") or ()), events
    finally:
        await admin.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{peers}", ok=(200, 404))


async def _held(holder: Any, prefix: str) -> str:
    h: str = await holder()
    return h if h.startswith(prefix) else ""


async def _exited(e: Elector) -> bool:
    return e.proc.poll() is not None
