"""Red team, configuration changes: `helm upgrade` changing `mtsched.keyPrefix` (or the Redis the roles reach,
`redis.external.url`) moves the ledger. While the roll lasts the old release's extender books on the old ledger and
the new one's on the new: a Binding in flight on one is no booking on the other, so two pods bound then may share a
card beyond what it has (docs/install.md, "Changing settings on a live cluster"). The chart let such an upgrade
through without a word; it now refuses it while the scheduler Deployment has replicas (naming the setting, both
values and what to do), and lets it through once the scheduler is scaled to 0 (no bind of the old release can be in
flight; the new ledger books nothing until the new watchers have rebuilt it from the API).

Real parts: kube-apiserver (helm's lookup of the live ConfigMap and Deployment), helm, the chart."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import yaml

from deploy.local.controlplane import ControlPlane
from deploy.local.identities import wait_no_policy
from tests.deploy._chart import CHART, Json, helm_env, run_helm, values_file
from tests.e2e.test_helm_dryrun import Api, _unique, api, helm  # noqa: F401 (fixtures)

pytestmark = pytest.mark.e2e


def test_redteam_cfg_a_ledger_move_needs_the_scheduler_scaled_to_zero(helm: Path,  # noqa: F811
                                                                     control_plane: ControlPlane,
                                                                     api: Api) -> None:  # noqa: F811
    release = _unique("hami-move")
    ns = _unique("helm-move")
    label: Json = {"scheduler": {"admissionWebhook": {"namespaceSelector": {"matchLabels": {"mtsched-move": release}}}}}
    with tempfile.TemporaryDirectory(prefix="helm-home-") as home:
        env = helm_env(Path(home))
        env["KUBECONFIG"] = str(control_plane.kubeconfig_path)

        def run(*args: str, values: Json, check: bool = True) -> tuple[int, str]:
            with values_file(values) as vf:
                proc = run_helm(helm, [*args, "--namespace", ns, "-f", str(vf)], env=env, check=check)
            return proc.returncode, proc.stdout + proc.stderr

        def config() -> Json:
            _, cm = api.call("GET", f"/api/v1/namespaces/{ns}/configmaps/{release}-config")
            return dict(yaml.safe_load(cm["data"]["config.yaml"]))

        try:
            run("install", release, str(CHART), "--create-namespace", values=label)
            assert config()["keyPrefix"] == "mt"
            moved = {**label, "mtsched": {"keyPrefix": "mt2"}}
            rc, out = run("upgrade", release, str(CHART), values=moved, check=False)
            assert rc != 0, "a keyPrefix change went through while the scheduler runs: two ledgers side by side"
            assert 'mtsched.keyPrefix "mt" -> "mt2"' in out and "--replicas=0" in out, out[-2000:]
            assert config()["keyPrefix"] == "mt"
            # an upgrade that moves nothing is not refused
            run("upgrade", release, str(CHART), values={**label, "mtsched": {"reconcileSeconds": 20}})
            scale = f"/apis/apps/v1/namespaces/{ns}/deployments/{release}-scheduler/scale"
            status, doc = api.call("GET", scale)
            assert status == 200, doc
            doc["spec"]["replicas"] = 0
            status, doc = api.call("PUT", scale, doc)
            assert status == 200, doc
            run("upgrade", release, str(CHART), values=moved)
            assert config()["keyPrefix"] == "mt2"
            # the Redis the roles reach is a move too (the chart set the scheduler's replicas back)
            external = {**moved, "redis": {"external": {"url": "redis://other-redis.example:6379/0"}}}
            rc, out = run("upgrade", release, str(CHART), values=external, check=False)
            assert rc != 0 and "redisUrl" in out and "moves the ledger" in out, out[-2000:]
        finally:
            run_helm(helm, ["uninstall", release, "--namespace", ns], env=env, check=False)
            wait_no_policy(control_plane)
