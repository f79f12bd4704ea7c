"""RBAC changed under a running role, on the real control plane with the chart's identities: the roles ask the
API server what they may do (shared/serving/access.py) and say so. A red team (ops) revoked the watcher's `get
pods`: a booking no live pod explains could no longer be confirmed with the API server, was kept for ever (fail
closed, rightly) and the watcher said it was ready all along. It says it is not now, naming the call, and heals
by itself once the permission is back."""

from __future__ import annotations

import copy
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio

from deploy.local.controlplane import ControlPlane
from deploy.local.redis import RedisServer
from deploy.local.stack import Role, Stack
from shared.domain.annotations import PodUsage
from tests.e2e._wait import until
from tests.e2e.test_product import Cluster

pytestmark = pytest.mark.e2e

CR = "/apis/rbac.authorization.k8s.io/v1/clusterroles/hami-watcher"
GHOST = "ghost-0c6f1e52-uid"


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane, redis_server: RedisServer) -> Iterator[Stack]:
    with Stack(control_plane, redis_server.empty().url, "96", extenders=1, webhooks=1, watchers=1,
               settings={"reconcileSeconds": 3}).running() as st:
        yield st


@pytest_asyncio.fixture
async def cluster(stack: Stack, redis_server: RedisServer) -> AsyncIterator[Cluster]:
    async with Cluster.opened(stack, stack.redis_url) as c:
        yield c


def readyz(role: Role) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{role.metrics_port}/readyz", timeout=3) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


async def test_a_watcher_denied_get_pods_says_so_keeps_the_booking_and_heals_when_allowed_again(
        stack: Stack, cluster: Cluster) -> None:
    cp = stack.cp
    watcher = stack.role("watcher", 0)
    node = await cluster.add_node(96, cards=2)
    original: list[dict[str, Any]] = cp.api("GET", CR)["rules"]
    no_get = [r for r in copy.deepcopy(original) if not (r.get("resources") == ["pods"] and r.get("verbs") == ["get"])]
    assert len(no_get) == len(original) - 1, original  # (the chart's rule for the reconciler's read)

    def set_rules(rules: list[dict[str, Any]]) -> None:
        cr = cp.api("GET", CR)
        cr["rules"] = rules
        cp.api("PUT", CR, cr)

    async def booked() -> bool:
        snap = (await cluster.snapshots()).get(node)
        return snap is not None and GHOST in snap.reservations

    set_rules(no_get)
    try:
        # a booking no live pod explains (a pod that ended while its release was lost), as the watcher's own
        # observe of a record writes it
        out = await cluster.ledger.observe(GHOST, PodUsage(node, (0,), 32, 4, 1), f"{cluster.ns}/ghost")
        assert out.get("ok"), out

        async def unready() -> str | None:
            status, body = readyz(watcher)
            return body if status == 503 and "get pods" in body else None

        body = await until(unready, "the watcher unready, naming get pods", stack.logs, timeout=60)
        assert "the API server denies get pods (the reconciler" in body, body
        assert await booked()  # kept meanwhile: nothing says the pod is gone
        assert "mtsched_permission_denied{resource=\"pods\",verb=\"get\"} 1.0" in stack.metrics(watcher)
    finally:
        set_rules(original)

    async def ready() -> bool | None:
        return True if readyz(watcher)[0] == 200 else None

    await until(ready, "the watcher ready again", stack.logs, timeout=60)

    async def freed() -> bool | None:
        return True if not await booked() else None

    await until(freed, "the booking no pod explains freed", stack.logs, timeout=60)
