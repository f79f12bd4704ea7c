"""The chart with `mtsched.quotaCheck: false` in the local harness: the webhook's pod mounts no token and
has no RBAC, so the harness runs it without credentials (deploy/local/identities.py token_mounted,
Stack.role_argv); it still admits and fills in pods, and the `limits.`/bare quota forms hold nothing."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.local.controlplane import ControlPlane
from deploy.local.redis import RedisServer
from deploy.local.stack import Stack
from shared.kube import Kube
from tests.deploy._chart import Case, find, helm_binary, objects, template

pytestmark = pytest.mark.e2e

MEM, VGPU = "mthreads.com/sgpu-memory", "mthreads.com/vgpu"


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane, redis_server: RedisServer, pytestconfig: pytest.Config,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    rendered = template(helm_binary(pytestconfig), Case({"mtsched": {"quotaCheck": False}})).stdout
    assert not find(objects(rendered), "ClusterRole", "hami-webhook")
    manifest: Path = tmp_path_factory.mktemp("no-quota-check") / "hami.yaml"
    manifest.write_text(rendered)
    with Stack(control_plane, redis_server.empty().url, "96", manifest=manifest).running() as st:
        yield st


async def test_the_webhook_runs_without_a_token_and_enforces_no_limits_quota(stack: Stack) -> None:
    ids = stack.provision()
    assert not ids["webhook"].token and not ids["webhook"].kubeconfig.exists()
    assert ids["watcher"].token and ids["watcher"].kubeconfig.exists()
    argv = stack.role_argv(next(r for r in stack.roles if r.kind == "webhook"))
    assert "quotaCheck=false" in argv and not any(a.startswith("kubeconfig=") for a in argv)

    admin = await Kube.create(str(stack.cp.kubeconfig_path))
    ns = f"e2e-noquota-{uuid.uuid4().hex[:6]}"
    try:
        await admin.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
        await admin.request("POST", f"/api/v1/namespaces/{ns}/resourcequotas",
                            {"metadata": {"name": "hami"}, "spec": {"hard": {f"limits.{MEM}": "2"}}})
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "exclusive"},
               "spec": {"containers": [{"name": "main", "image": "busybox",
                                        "resources": {"limits": {VGPU: "1"}}}]}}
        out = await admin.request("POST", f"/api/v1/namespaces/{ns}/pods", pod)
        # the webhook judged it (filled in a whole S4000) and, without its quota check, let 96 past a limit of 2
        assert out["spec"]["containers"][0]["resources"]["limits"][MEM] == "96"
        assert out["spec"]["schedulerName"] == stack.settings.get("schedulerName", "hami-scheduler")
    finally:
        await admin.request("DELETE", f"/api/v1/namespaces/{ns}/pods", query={"gracePeriodSeconds": "0"},
                            ok=(200, 202, 404))
        await admin.close()
