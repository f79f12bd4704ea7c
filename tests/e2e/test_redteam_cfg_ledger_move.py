"""Red team, configuration changes: `helm upgrade` changing `mtsched.keyPrefix` (or the Redis the roles reach,
`redis.external.url`) moves the ledger. While the roll lasts the old release's extender books on the old ledger and
the new one's on the new: a Binding in flight on one is no booking on the other, so two pods bound then may share a
card beyond what it has (docs/install.md, "Changing settings on a live cluster"). The chart let such an upgrade
through without a word; it now refuses it while the scheduler Deployment has replicas (naming the setting, both
values and what to do), and lets it through once the scheduler is scaled to 0 (no bind of the old release can be in
flight; the new ledger books nothing until the new watchers have rebuilt it from the API).

Red team, the day's changes: the refusal compared the whole Redis URL, which carries the ACL user
(redis.external.username goes into it): a rotation of the user, the same Redis and keys, was refused as a move to
another ledger, an upgrade that needed the scheduler scaled to 0 for nothing. So was the same Redis written another
way (`redis://h` for `redis://h:6379/0`: the roles' defaults). Another Redis or database is still refused.

Real parts: kube-apiserver (helm's lookup of the live ConfigMap and Deployment), helm, the chart."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from deploy.local.controlplane import ControlPlane
from deploy.local.identities import wait_no_policy
from tests.deploy._chart import CHART, Json, helm_env, run_helm, values_file
from tests.e2e.test_helm_dryrun import Api, _unique, api, helm  # noqa: F401 (fixtures)

pytestmark = pytest.mark.e2e

@dataclass
class Release:
    """A release of the chart in a namespace of its own, its webhook sent only pods labelled for it."""

    name: str
    ns: str
    label: Json
    run: Callable[..., tuple[int, str]]  # run(helm args..., values=..., check=True) -> (exit code, output)

    def config(self, api: Api) -> Json:  # noqa: F811
        """Its rendered configuration, as the API server holds it."""
        _, cm = api.call("GET", f"/api/v1/namespaces/{self.ns}/configmaps/{self.name}-config")
        return dict(yaml.safe_load(cm["data"]["config.yaml"]))


@contextmanager
def a_release(helm: Path, control_plane: ControlPlane, what: str) -> Iterator[Release]:  # noqa: F811
    name, ns = _unique(f"hami-{what}"), _unique(f"helm-{what}")
    label: Json = {"scheduler": {"admissionWebhook": {"namespaceSelector": {"matchLabels": {f"mtsched-{what}": name}}}}}
    with tempfile.TemporaryDirectory(prefix="helm-home-") as home:
        env = helm_env(Path(home))
        env["KUBECONFIG"] = str(control_plane.kubeconfig_path)

        def run(verb: str, values: Json, *more: str, check: bool = True) -> tuple[int, str]:
            with values_file(values) as vf:
                proc = run_helm(helm, [verb, name, str(CHART), *more, "--namespace", ns, "-f", str(vf)], env=env,
                                check=check)
            return proc.returncode, proc.stdout + proc.stderr

        try:
            yield Release(name, ns, label, run)
        finally:
            run_helm(helm, ["uninstall", name, "--namespace", ns], env=env, check=False)
            wait_no_policy(control_plane)


def test_redteam_cfg_a_ledger_move_needs_the_scheduler_scaled_to_zero(helm: Path,  # noqa: F811
                                                                     control_plane: ControlPlane,
                                                                     api: Api) -> None:  # noqa: F811
    with a_release(helm, control_plane, "move") as r:
        r.run("install", r.label, "--create-namespace")
        assert r.config(api)["keyPrefix"] == "mt"
        moved = {**r.label, "mtsched": {"keyPrefix": "mt2"}}
        rc, out = r.run("upgrade", moved, check=False)
        assert rc != 0, "a keyPrefix change went through while the scheduler runs: two ledgers side by side"
        assert 'mtsched.keyPrefix "mt" -> "mt2"' in out and "--replicas=0" in out, out[-2000:]
        assert r.config(api)["keyPrefix"] == "mt"
        # an upgrade that moves nothing is not refused
        r.run("upgrade", {**r.label, "mtsched": {"reconcileSeconds": 20}})
        scale = f"/apis/apps/v1/namespaces/{r.ns}/deployments/{r.name}-scheduler/scale"
        status, doc = api.call("GET", scale)
        assert status == 200, doc
        doc["spec"]["replicas"] = 0
        status, doc = api.call("PUT", scale, doc)
        assert status == 200, doc
        r.run("upgrade", moved)
        assert r.config(api)["keyPrefix"] == "mt2"
        # the Redis the roles reach is a move too (the chart set the scheduler's replicas back)
        external = {**moved, "redis": {"external": {"url": "redis://other-redis.example:6379/0"}}}
        rc, out = r.run("upgrade", external, check=False)
        assert rc != 0 and "redisUrl" in out and "moves the ledger" in out, out[-2000:]


def test_redteam_today2_a_new_redis_user_is_no_ledger_move(helm: Path, control_plane: ControlPlane,  # noqa: F811
                                                          api: Api) -> None:  # noqa: F811
    with a_release(helm, control_plane, "user") as r:
        def external(user: str, url: str = "redis://ledger-redis.example:6379/0") -> Json:
            return {**r.label, "redis": {"external": {"url": url, "existingSecret": "ledger-redis", "username": user}}}

        r.run("install", external("mtsched-a"), "--create-namespace")
        assert r.config(api)["redisUrl"] == "redis://mtsched-a@ledger-redis.example:6379/0"
        rc, out = r.run("upgrade", external("mtsched-b"), check=False)
        assert rc == 0, f"a new ACL user on the same Redis was refused as a ledger move: {out[-2000:]}"
        assert r.config(api)["redisUrl"] == "redis://mtsched-b@ledger-redis.example:6379/0"
        # the same Redis written another way (the port and database the roles default to, client options) is none
        for same in ("redis://ledger-redis.example", "redis://ledger-redis.example:6379/?socket_timeout=3"):
            rc, out = r.run("upgrade", external("mtsched-b", same), check=False)
            assert rc == 0, f"{same} was refused as a ledger move: {out[-2000:]}"
        # another database of it is one, and so is another Redis
        rc, out = r.run("upgrade", external("mtsched-b", "redis://ledger-redis.example/1"), check=False)
        assert rc != 0 and "moves the ledger" in out, out[-2000:]
        rc, out = r.run("upgrade", external("mtsched-b", "redis://other-redis.example:6379/0"), check=False)
        assert rc != 0 and "moves the ledger" in out, out[-2000:]
        assert "ledger-redis.example" in str(r.config(api)["redisUrl"])
