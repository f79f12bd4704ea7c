"""Red team, today's changes: the chart's refusal of a ledger move while the scheduler runs (validate.yaml) compared
the whole Redis URL, which carries the ACL user (redis.external.username goes into it): a rotation of the user, the
same Redis and keys, was refused as a move to another ledger, an upgrade that needed the scheduler scaled to 0 for
nothing. Another Redis is still refused.

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


def test_redteam_today2_a_new_redis_user_is_no_ledger_move(helm: Path, control_plane: ControlPlane,  # noqa: F811
                                                          api: Api) -> None:  # noqa: F811
    release = _unique("hami-user")
    ns = _unique("helm-user")
    label: Json = {"scheduler": {"admissionWebhook": {"namespaceSelector": {"matchLabels": {"mtsched-user": release}}}}}

    def external(user: str, url: str = "redis://ledger-redis.example:6379/0") -> Json:
        return {**label, "redis": {"external": {"url": url, "existingSecret": "ledger-redis", "username": user}}}

    with tempfile.TemporaryDirectory(prefix="helm-home-") as home:
        env = helm_env(Path(home))
        env["KUBECONFIG"] = str(control_plane.kubeconfig_path)

        def run(*args: str, values: Json, check: bool = True) -> tuple[int, str]:
            with values_file(values) as vf:
                proc = run_helm(helm, [*args, "--namespace", ns, "-f", str(vf)], env=env, check=check)
            return proc.returncode, proc.stdout + proc.stderr

        def redis_url() -> str:
            _, cm = api.call("GET", f"/api/v1/namespaces/{ns}/configmaps/{release}-config")
            return str(yaml.safe_load(cm["data"]["config.yaml"])["redisUrl"])

        try:
            run("install", release, str(CHART), "--create-namespace", values=external("mtsched-a"))
            assert redis_url() == "redis://mtsched-a@ledger-redis.example:6379/0"
            rc, out = run("upgrade", release, str(CHART), values=external("mtsched-b"), check=False)
            assert rc == 0, f"a new ACL user on the same Redis was refused as a ledger move: {out[-2000:]}"
            assert redis_url() == "redis://mtsched-b@ledger-redis.example:6379/0"
            # another Redis still is a move
            rc, out = run("upgrade", release, str(CHART), check=False,
                          values=external("mtsched-b", "redis://other-redis.example:6379/0"))
            assert rc != 0 and "moves the ledger" in out, out[-2000:]
            assert "ledger-redis.example" in redis_url()
        finally:
            run_helm(helm, ["uninstall", release, "--namespace", ns], env=env, check=False)
            wait_no_policy(control_plane)
