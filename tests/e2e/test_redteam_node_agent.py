"""Red team, on the real control plane: the node agent's admission policy promises that the agent writes
its own Node's `mtsched.io/card-knobs` annotation and nothing else. It compared spec, labels and the other
annotations, but not metadata.finalizers or metadata.ownerReferences: the agent (any process holding the
token of its DaemonSet pod on that node) could add a finalizer (the Node can no longer be deleted, e.g. by
the node lifecycle or cluster autoscaler) or an owner reference to an object that does not exist (the
garbage collector then deletes the Node)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from redis.asyncio import Redis

from deploy.local.controlplane import ControlPlane
from deploy.local.identities import node_identity
from deploy.local.redis import RedisServer
from deploy.local.stack import Stack
from shared.domain.knobs import ANNOTATION
from shared.kube import Kube
from shared.store.ledger import Ledger
from tests.deploy._chart import helm_binary, run_helm
from tests.e2e.test_node_agent import patch_as, until
from tests.e2e.test_product import Cluster

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def manifest(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    helm = helm_binary(pytestconfig)
    out = run_helm(helm, ["template", "hami", str(Path(__file__).resolve().parents[2] / "deploy/helm/hami"),
                          "--namespace", "kube-system", "--kube-version", "v1.36.3", "--set", "tls.mode=external",
                          "--set", "redis.auth.existingSecret=hami-redis-auth", "--set", "nodeAgent.enabled=true"])
    path = tmp_path_factory.mktemp("chart") / "hami-node-agent.yaml"
    path.write_text(out.stdout)
    return path


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane, redis_server: RedisServer, manifest: Path) -> Iterator[Stack]:
    import redis as sync_redis

    if redis_server.proc is None or redis_server.proc.poll() is not None:
        redis_server.start()
    sync_redis.Redis(port=redis_server.port, password=redis_server.password).flushall()
    st = Stack(control_plane, redis_server.url, "96", manifest=manifest)
    with st.running():
        yield st


@pytest_asyncio.fixture
async def cluster(stack: Stack, redis_server: RedisServer) -> AsyncIterator[Cluster]:
    kube = await Kube.create(str(stack.cp.kubeconfig_path))
    client = Redis.from_url(redis_server.url, decode_responses=True)
    ledger = Ledger(client)
    await ledger.load_scripts()
    c = Cluster(kube, ledger, stack.memory_per_card)
    await c.setup()
    try:
        yield c
    finally:
        await c.cleanup()
        await client.aclose()
        await kube.close()


async def test_the_agent_cannot_add_finalizers_or_owners_to_its_node(
        stack: Stack, cluster: Cluster, tmp_path: Path) -> None:
    node = await cluster.add_node(96, cards=1)
    ids = stack.provision()
    agent = node_identity(stack.cp, ids, "node-agent", node, tmp_path)
    knobs_only = {"metadata": {"annotations": {ANNOTATION: '{"v":1,"cards":{}}'}}}
    assert await until("the policy admits the agent's own annotation",
                       lambda: _admitted(agent.kubeconfig, node, knobs_only)) is True
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
