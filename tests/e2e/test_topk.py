"""The filter's top k on the real control plane (shared/domain/topk.py, docs/rules.md "Top-k filter").

With filterTopK=1 the filter returns one node, kube-scheduler skips scoring, and placement is our node
policy's choice even against a preferred node affinity; binpack fills nodes one after another in name order.
With filterTopK=2 kube-scheduler's NodeAffinity score plugin still decides among the two (a node that is not
our first choice), and a node outside the best two is not a candidate even when the pod prefers it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from deploy.local.controlplane import ControlPlane
from deploy.local.redis import RedisServer
from deploy.local.stack import Stack
from shared.domain.fit import USE_UUID
from tests.e2e.test_product import CORE, MEM, VGPU, Cluster

pytestmark = pytest.mark.e2e

SLICE = {VGPU: 1, MEM: 32, CORE: 4}  # a third of a card


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest, control_plane: ControlPlane, redis_server: RedisServer) -> Iterator[Stack]:
    with Stack(control_plane, redis_server.empty().url, "96", settings={"filterTopK": request.param}).running() as st:
        yield st


def prefer(p: dict[str, Any], node: str) -> dict[str, Any]:
    """A preferred node affinity (kube-scheduler's NodeAffinity score plugin) for `node`."""
    p["spec"]["affinity"] = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "preference": {"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}}]}}
    return p


async def place(cluster: Cluster, p: dict[str, Any]) -> str:
    """Create the pod, wait until it is bound and the ledger holds it; its node."""
    await cluster.create(p)
    name = p["metadata"]["name"]
    node = str((await cluster.wait_bound(name))[name]["spec"]["nodeName"])
    await cluster.wait_ledger(lambda s: any(r.pod.endswith(f"/{name}") and r.state == "bound"
                                            for r in s[node].reservations.values()))
    return node


async def three_nodes_the_last_fullest(cluster: Cluster) -> tuple[str, str, str]:
    """Three empty two-card nodes, then a slice pinned to the third's card 0: binpack's first choice is the third."""
    n0, n1, n2 = [await cluster.add_node(96, cards=2) for _ in range(3)]
    assert await place(cluster, cluster.pod("pinned", SLICE, annotations={USE_UUID: f"{n2}-mthreads-0"})) == n2
    return n0, n1, n2


@pytest.mark.parametrize("stack", [1], indirect=True)
async def test_k1_places_on_our_policys_choice_against_a_preferred_node(cluster: Cluster) -> None:
    n0, _, n2 = await three_nodes_the_last_fullest(cluster)
    # the pod prefers n0 (weight 100), but only n2 is returned by the filter: kube-scheduler does not score
    assert await place(cluster, prefer(cluster.pod("wants-n0", SLICE), n0)) == n2


@pytest.mark.parametrize("stack", [1], indirect=True)
async def test_k1_binpack_fills_nodes_in_order(cluster: Cluster) -> None:
    nodes = [await cluster.add_node(96, cards=2) for _ in range(3)]
    # 32 units each: three per card, six per node; ties between equally full nodes go by name
    got = [await place(cluster, cluster.pod(f"p{i}", SLICE)) for i in range(8)]
    assert got == [nodes[0]] * 6 + [nodes[1]] * 2


@pytest.mark.parametrize("stack", [2], indirect=True)
async def test_k2_a_score_plugin_decides_among_the_best_two(cluster: Cluster) -> None:
    n0, n1, n2 = await three_nodes_the_last_fullest(cluster)
    # the best two by binpack: n2 (fullest), then n0 (empty, first by name). NodeAffinity's score
    # (2 x 100 for the preferred node) outweighs our prioritize (weight 1 x 10 x fill) inside the two:
    assert await place(cluster, prefer(cluster.pod("wants-n0", SLICE), n0)) == n0
    # n1 (empty) is now the emptiest, outside the best two (n0 and n2 hold one slice each): not a candidate
    assert await place(cluster, prefer(cluster.pod("wants-n1", SLICE), n1)) in (n0, n2)
