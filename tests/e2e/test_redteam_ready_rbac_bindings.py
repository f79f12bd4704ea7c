"""Red team (readiness honesty): the extender's ClusterRoleBindings deleted under it, on the real API server with
the chart's identities (deploy/manifests/hami.yaml). Its ServiceAccount holds its needs (shared/domain/access.py:
create pods/binding, get pods, get nodes) twice: from `hami-extender` and from `system:kube-scheduler`, the
ClusterRole kube-scheduler's own binding grants, in the same pod's ServiceAccount. So deleting one binding must not
make it unready (a spurious unready takes the leader's sidecar out, and after leaderYieldSeconds the Lease); deleting
both must, within the access review's period (30 s), naming the call, while the watcher and the webhook, who do not
need them, stay ready and the extender stays alive (/healthz: a restart grants nothing); and putting them back makes
it ready again within that period, without a restart. Passed as it stands (no finding): kept as evidence."""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from deploy.local.controlplane import ControlPlane
from deploy.local.redis import RedisServer
from deploy.local.stack import Role, Stack
from tests.e2e._wait import until

pytestmark = pytest.mark.e2e

CRB = "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/"
BINDINGS = ("hami-extender", "hami-scheduler-kube-scheduler")
ACCESS_SECONDS = 30.0  # shared/serving/access.py
SLACK = 15.0  # the RBAC cache of the API server, the stack's 2 cores


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane, redis_server: RedisServer) -> Iterator[Stack]:
    with Stack(control_plane, redis_server.empty().url, "96", extenders=1, webhooks=1, watchers=1).running() as st:
        yield st


def probe(role: Role, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{role.metrics_port}{path}", timeout=3) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def fresh(obj: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in obj["metadata"].items() if k in ("name", "labels", "annotations")}
    return {**{k: v for k, v in obj.items() if k != "metadata"}, "metadata": meta}


async def test_the_extender_unready_only_when_no_binding_grants_its_calls_and_ready_again_when_one_does(
        stack: Stack) -> None:
    cp = stack.cp
    ext, watcher, webhook = (stack.role(k, 0) for k in ("extender", "watcher", "webhook"))
    saved = {name: fresh(cp.api("GET", CRB + name)) for name in BINDINGS}

    async def ready(role: Role) -> bool | None:
        return True if probe(role, "/readyz")[0] == 200 else None

    for role in (ext, watcher, webhook):
        await until(lambda r=role: ready(r), f"{role.kind} ready", stack.logs, timeout=60)
    try:
        cp.api("DELETE", CRB + BINDINGS[0])
        # two access reviews later, and still ready: system:kube-scheduler grants the same calls
        loop_end = time.monotonic() + ACCESS_SECONDS + SLACK
        while time.monotonic() < loop_end:
            status, body = probe(ext, "/readyz")
            assert status == 200, f"a spurious unready with one of two bindings left: {body}"
            await asyncio.sleep(1.0)
        cp.api("DELETE", CRB + BINDINGS[1])

        async def unready() -> str | None:
            status, body = probe(ext, "/readyz")
            return body if status == 503 and "create pods/binding" in body else None

        body = await until(unready, "the extender unready, naming the Binding it may not create", stack.logs,
                           timeout=ACCESS_SECONDS + SLACK)
        assert "access: the API server denies" in body, body
        assert probe(ext, "/healthz")[0] == 200  # alive: a restart would not grant it anything
        for role in (watcher, webhook):
            status, body = probe(role, "/readyz")
            assert status == 200, f"{role.kind} unready for what only the extender needs: {body}"
    finally:
        for obj in saved.values():
            cp.api("POST", CRB.rstrip("/"), obj, ok=(200, 201, 409))
    await until(lambda: ready(ext), "the extender ready again", stack.logs, timeout=ACCESS_SECONDS + SLACK)
