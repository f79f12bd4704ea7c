"""Every watcher down, on the real control plane with the chart's identities: the extender stops placing slice pods
once the watchers' stamp on the ledger is older than `watchersLostAfterSeconds` (the pod's events say why), and when
a watcher is back the pod turned away meanwhile binds without waiting for kube-scheduler's 5-minute retry (the
extender wakes it through the watcher's Node nudge). shared/domain/upkeep.py, controller/upkeep.py."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterator

import pytest

from deploy.local.controlplane import ControlPlane
from deploy.local.redis import RedisServer
from deploy.local.stack import Stack
from tests.e2e._wait import until_true
from tests.e2e.test_product import CORE, MEM, VGPU, Cluster

pytestmark = [pytest.mark.e2e, pytest.mark.faults]

LOST_AFTER = 30  # the shortest allowed


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane, redis_server: RedisServer) -> Iterator[Stack]:
    with Stack(control_plane, redis_server.empty().url, "96",
               settings={"watchersLostAfterSeconds": LOST_AFTER, "reconcileSeconds": 5}).running() as st:
        yield st


def kept_age(stack: Stack) -> float:
    """The extender's mtsched_ledger_kept_age_seconds (-1: no stamp read)."""
    found = re.search(r"^mtsched_ledger_kept_age_seconds (\S+)$", stack.metrics(stack.role("extender")), re.M)
    assert found, "the extender exports no mtsched_ledger_kept_age_seconds"
    return float(found.group(1))


def age_within(stack: Stack, low: float, high: float) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return low <= kept_age(stack) < high

    return check


async def turned_away_while_unkept(cluster: Cluster, stack: Stack, name: str) -> None:
    """Every watcher down (the stack's only one) past watchersLostAfterSeconds, then the slice pod `name` created:
    the extender refuses it, saying why."""
    await until_true(age_within(stack, 0, LOST_AFTER), "the watcher's stamp read", stack.logs, timeout=20)
    stack.kill("watcher")
    await until_true(age_within(stack, LOST_AFTER + 0.001, 1e9), "the stamp older than watchersLostAfterSeconds",
                     stack.logs, timeout=LOST_AFTER + 20)
    await cluster.create(cluster.pod(name, {VGPU: 1, MEM: 16, CORE: 4}))

    async def refused() -> bool:
        return any("no watcher has kept the ledger current" in e for e in await cluster.events(name))

    await until_true(refused, "the pod refused, saying why", stack.logs)


async def test_no_slice_pod_is_placed_while_no_watcher_keeps_the_ledger(cluster: Cluster, stack: Stack) -> None:
    node = await cluster.add_node(96, cards=2)
    await cluster.create(cluster.pod("first", {VGPU: 1, MEM: 16, CORE: 4}))
    assert (await cluster.wait_bound("first"))["first"]["spec"]["nodeName"] == node
    await turned_away_while_unkept(cluster, stack, "later")
    assert not (await cluster.get("later"))["spec"].get("nodeName")

    stack.respawn("watcher")  # back: it stamps the ledger, the extender wakes the pod it turned away
    pod = (await cluster.wait_bound("later", timeout=60))["later"]
    assert pod["spec"]["nodeName"] == node
    assert 0 <= kept_age(stack) < LOST_AFTER


async def test_a_pod_turned_away_before_the_extender_restarted_binds_once_a_watcher_is_back(
        cluster: Cluster, stack: Stack) -> None:
    """The extender that turned the pod away is gone (restarted: its wake set was in memory), so it is the watcher
    back after the outage that wakes the pod: one Node nudge, which every pod an extender turned away takes as its
    retry (nudgeAnyNode, on this kube-scheduler). Without it the pod waits for kube-scheduler's 5-minute retry."""
    node = await cluster.add_node(96, cards=2)
    await turned_away_while_unkept(cluster, stack, "forgotten")
    stack.restart("extender")  # the process that turned it away, and what it meant to wake, gone
    await until_true(age_within(stack, LOST_AFTER + 0.001, 1e9), "the new extender's verdict: not kept",
                     stack.logs, timeout=20)
    stack.respawn("watcher")
    pod = (await cluster.wait_bound("forgotten", timeout=60))["forgotten"]
    assert pod["spec"]["nodeName"] == node
