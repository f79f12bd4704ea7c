"""The node agent end to end: `mtsched node-agent` under the chart's node-agent identity (a token bound to
its Node, as a DaemonSet pod's is) against the real API server, reading a fake /proc/sgpu_km tree;
the chart's admission policy keeps it to its own Node and its one annotation; the scheduler honours
each card's max_inst, and a knob change under held slices is a Warning event on the Node.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from controller.cards import card_table
from deploy.local.controlplane import ControlPlane
from deploy.local.identities import node_identity
from deploy.local.redis import RedisServer, free_port, terminate
from deploy.local.stack import Stack
from shared.domain.knobs import ANNOTATION, CardKnobs, decode_annotation
from shared.kube import Kube, KubeError
from tests.e2e._chart import rendered
from tests.e2e._wait import until_true
from tests.e2e.test_product import CORE, MEM, SCENARIO_LABEL, VGPU, Cluster, grants

pytestmark = pytest.mark.e2e

T = TypeVar("T")
MERGE = "application/merge-patch+json"



@pytest.fixture(scope="module")
def manifest(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The chart rendered as deploy/manifests/render.sh does, with the node agent enabled."""
    return rendered(pytestconfig, tmp_path_factory, "hami-node-agent.yaml", "nodeAgent.enabled=true")


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane, redis_server: RedisServer, manifest: Path) -> Iterator[Stack]:
    with Stack(control_plane, redis_server.empty().url, "96", manifest=manifest).running() as st:
        yield st


def write_card(root: Path, card: int, max_inst: int, policy: int = 0, time_slice: int = 1,
               overcommit: int = 100) -> None:
    d = root / str(card)
    d.mkdir(parents=True, exist_ok=True)
    for name, value in (("max_inst", max_inst), ("policy", policy), ("time_slice", time_slice),
                        ("overcommit_ratio", overcommit)):
        tmp = d / f".{name}"
        tmp.write_text(f"{value}\n")
        tmp.replace(d / name)  # whole files only: the agent never reads a half-written value


def start_agent(stack: Stack, kubeconfig: Path, node: str, root: Path, log: Path,
                metrics_port: int) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "controller.cli", "node-agent", "--config", str(stack.config_path),
            "--set", f"kubeconfig={kubeconfig}", "--set", f"metricsListen=127.0.0.1:{metrics_port}",
            "--log-format", "text"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "MTSCHED_NODE_NAME": node,  # what the downward API sets
           "MTSCHED_CARD_KNOBS_PATH": str(root), "MTSCHED_CARD_KNOBS_SECONDS": "1"}
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)


async def patch_as(kubeconfig: Path, node: str, body: dict[str, Any]) -> KubeError | None:
    kube = await Kube.create(str(kubeconfig))
    try:
        await kube.request("PATCH", f"/api/v1/nodes/{node}", body, content_type=MERGE)
        return None
    except KubeError as e:
        return e
    finally:
        await kube.close()


async def test_the_agent_publishes_and_the_scheduler_honours_each_cards_max_inst(
        stack: Stack, cluster: Cluster, tmp_path: Path) -> None:
    node = await cluster.add_node(96, cards=2)
    other = await cluster.add_node(96, cards=1)
    ids = stack.provision()
    agent_id = node_identity(stack.cp, ids, "node-agent", node, tmp_path)

    # What the chart enforces: a token bound to no node, or to another node, may not write this Node; the
    # node's own may change only the card-knobs annotation.
    knobs_only = {"metadata": {"annotations": {ANNOTATION: '{"v":1,"cards":{}}'}}}
    refused = await until_true(lambda: patch_as(ids["node-agent"].kubeconfig, node, knobs_only),
                               "the node-agent policy refuses an unbound token")
    assert refused.status == 403 and "only the Node its pod runs on" in str(refused), refused
    refused = await patch_as(agent_id.kubeconfig, other, knobs_only)
    assert refused is not None and refused.status == 403 and "only the Node its pod runs on" in str(refused)
    for body in ({"metadata": {"labels": {"mthreads.com/gpu-node": "false"}}},
                 {"metadata": {"annotations": {"mtsched.io/max-inst": "16"}}}, {"spec": {"unschedulable": True}}):
        refused = await patch_as(agent_id.kubeconfig, node, body)
        assert refused is not None and refused.status == 403, body
        assert "only the annotation mtsched.io/card-knobs" in str(refused), refused
    # RBAC: get and patch nodes, nothing else
    kube = await Kube.create(str(agent_id.kubeconfig))
    try:
        with pytest.raises(KubeError) as listed:
            await kube.request("GET", "/api/v1/nodes")
        assert listed.value.status == 403
    finally:
        await kube.close()

    root = tmp_path / "sgpu_km"
    write_card(root, 0, max_inst=16)
    write_card(root, 1, max_inst=1, policy=2, time_slice=3, overcommit=110)
    port = free_port()
    proc = start_agent(stack, agent_id.kubeconfig, node, root, tmp_path / "agent.log", port)
    try:
        async def published() -> dict[int, CardKnobs] | None:
            got = await cluster.kube.get_node(node)
            raw = got["metadata"].get("annotations", {}).get(ANNOTATION)
            return dict(decode_annotation(raw).cards) if raw else None

        cards = await until_true(published, "the agent publishes the card knobs")
        assert cards == {0: CardKnobs(16, 0, 1, 100), 1: CardKnobs(1, 2, 3, 110)}, (tmp_path / "agent.log").read_text()
        await cluster.wait_ledger(lambda s: s[node].cards[1].slice_limit == 1 and s[node].cards[1].knobs is not None)
        table = await card_table(cluster.ledger)
        row = next(line for line in table.splitlines() if f"{node}-mthreads-1" in line)
        assert "1/96" not in row and "0/1" in row and "strong, 3 ms" in row and "110%" in row, table

        def on_node(name: str, annotations: dict[str, str]) -> dict[str, Any]:
            pod = cluster.pod(name, {VGPU: 1, MEM: 8, CORE: 2}, annotations=annotations)
            pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node, SCENARIO_LABEL: cluster.id}
            return pod

        binpack = {"hami.io/gpu-scheduler-policy": "binpack"}
        # binpack ties go to the highest index: card 1, whose max_inst 1 it now fills
        await cluster.create(on_node("a", binpack))
        first = (await cluster.wait_bound("a"))["a"]
        assert first["spec"]["nodeName"] == node and grants(first)[0][0].device_id == f"{node}-mthreads-1"
        # binpack would pick the fuller card 1 again; its max_inst sends the slice to card 0
        await cluster.create(on_node("b", binpack))
        second = (await cluster.wait_bound("b"))["b"]
        assert second["spec"]["nodeName"] == node and grants(second)[0][0].device_id == f"{node}-mthreads-0"
        # a slice that may use card 1 only waits, with the reason
        await cluster.create(on_node("c", {"mthreads.ai/use-gpuuuid": f"{node}-mthreads-1"}))
        await until_true(
            lambda: _with(cluster.events("c"), lambda ev: any("CardTimeSlicingExhausted" in e for e in ev)),
            "c is refused for the slice limit")
        assert not (await cluster.get("c"))["spec"].get("nodeName")

        # max_inst changed on card 1 while pod a holds it: a Warning event on the Node and a metric
        write_card(root, 1, max_inst=4, policy=2, time_slice=3, overcommit=110)

        async def warned() -> list[dict[str, Any]] | None:
            listed = await cluster.kube.request("GET", "/api/v1/namespaces/default/events")
            return [e for e in listed["items"] if e["involvedObject"].get("name") == node
                    and e["reason"] == "CardKnobsChangedWhileHeld"] or None

        [event] = await until_true(warned, "the watcher reports the knob change under held slices")
        assert event["type"] == "Warning" and event["involvedObject"]["kind"] == "Node"
        assert f"card {node}-mthreads-1: max_inst changed 1 -> 4" in event["message"]
        assert f"{cluster.ns}/a" in event["message"] and "drain the card first" in event["message"]
        metrics = stack.metrics(stack.role("watcher"))
        assert 'mtsched_card_knob_changes_held_total{knob="max_inst"} 1.0' in metrics
        # scheduling follows the new value: card 1 takes the waiting slice now
        bound = (await cluster.wait_bound("c"))["c"]
        assert grants(bound)[0][0].device_id == f"{node}-mthreads-1"
        # overcommit_ratio may change under held slices (the vendor does not freeze it): no warning
        write_card(root, 1, max_inst=4, policy=2, time_slice=3, overcommit=150)
        await until_true(lambda: _with(cluster.snapshots(), lambda s: s[node].cards[1].overcommit_ratio == 150),
                         "card 1's new overcommit_ratio reaches the ledger")
        assert len(await warned() or []) == 1
        assert f"published {ANNOTATION} on node {node}" in (tmp_path / "agent.log").read_text()
    finally:
        terminate(proc)


async def test_the_agent_cannot_add_finalizers_or_owners_to_its_node(
        stack: Stack, cluster: Cluster, tmp_path: Path) -> None:
    """Red team: the node agent's admission policy promises that the agent writes its own Node's
    `mtsched.io/card-knobs` annotation and nothing else. It compared spec, labels and the other
    annotations, but not metadata.finalizers or metadata.ownerReferences: the agent (any process holding the
    token of its DaemonSet pod on that node) could add a finalizer (the Node can no longer be deleted, e.g. by
    the node lifecycle or cluster autoscaler) or an owner reference to an object that does not exist (the
    garbage collector then deletes the Node)."""
    node = await cluster.add_node(96, cards=1)
    ids = stack.provision()
    agent = node_identity(stack.cp, ids, "node-agent", node, tmp_path)
    knobs_only = {"metadata": {"annotations": {ANNOTATION: '{"v":1,"cards":{}}'}}}
    assert await until_true(lambda: _admitted(agent.kubeconfig, node, knobs_only),
                            "the policy admits the agent's own annotation") is True
    uid = (await cluster.kube.request("GET", f"/api/v1/nodes/{node}"))["metadata"]["uid"]
    owner = {"apiVersion": "v1", "kind": "Node", "name": f"{node}-gone", "uid": uid[:-4] + "0000"}
    for body in ({"metadata": {"finalizers": ["example.com/never"]}},
                 {"metadata": {"ownerReferences": [owner]}}):
        refused = await patch_as(agent.kubeconfig, node, body)
        assert refused is not None and refused.status == 403, body
        assert "only the annotation mtsched.io/card-knobs" in str(refused), refused
    meta = (await cluster.kube.request("GET", f"/api/v1/nodes/{node}"))["metadata"]
    assert not meta.get("finalizers") and not meta.get("ownerReferences"), meta


async def _admitted(kubeconfig: Path, node: str, body: dict[str, Any]) -> bool | None:
    return True if await patch_as(kubeconfig, node, body) is None else None


async def _with(value: Awaitable[T], ok: Callable[[T], bool]) -> bool:
    return ok(await value)
