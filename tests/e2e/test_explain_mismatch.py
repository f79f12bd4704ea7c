"""Issue 13 items 3 and 5 on the real control plane: `mtsched explain` and the extender's /debug/explain for a pod
that is Pending because its cards are full, and nodes whose numbers disagree with the configuration made
loud (node events, gauge, start-up line, admission warning, explain).

One plane for this module alone (own_control_plane): the admission warning depends on every node of the
cluster, so no other module's nodes may be there. memoryPerCard [96]; before the roles start, the plane
has an S5000 node (160 units per card: no configured model) and an S4000 node whose sgpu.cores label lists
3 cards while its capacity says 2. Two watchers run, so "once per change" holds across replicas.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import pytest
import pytest_asyncio

from deploy.local import nodes as simulated
from deploy.local.controlplane import ControlPlane
from deploy.local.redis import RedisServer
from deploy.local.stack import Stack
from shared.kube import Kube
from tests.e2e._wait import until_true

pytestmark = pytest.mark.e2e

LABEL = "mtsched.io/e2e-explain"
POOL = "mtsched.io/e2e-explain-pool"
VGPU, MEM, CORE = "mthreads.com/vgpu", "mthreads.com/sgpu-memory", "mthreads.com/sgpu-core"
S5000_ERROR = "160 units per card (320/2) is no configured card model; memoryPerCard [96]"


@dataclass
class World:
    cp: ControlPlane
    stack: Stack
    run: str
    s5000: str
    badlabel: str


@pytest.fixture(scope="module")
def world(own_control_plane: ControlPlane, redis_server: RedisServer) -> Iterator[World]:
    import redis as sync_redis

    cp = own_control_plane
    if redis_server.proc is None or redis_server.proc.poll() is not None:
        redis_server.start()
    sync_redis.Redis(port=redis_server.port, password=redis_server.password).flushall()
    run = uuid.uuid4().hex[:6]
    s5000, badlabel = f"s5000-{run}", f"badlabel-{run}"
    cp.api("POST", "/api/v1/nodes",
           simulated.gpu_node(s5000, simulated.S5000_MEMORY_UNITS, sliced_cards=2, labels={LABEL: run}))
    bad = simulated.gpu_node(badlabel, simulated.S4000_MEMORY_UNITS, sliced_cards=2, labels={LABEL: run})
    bad["metadata"]["labels"][simulated.LABEL_SLICED_CORES] = "0-1-2"  # 3 card ids, capacity for 2
    cp.api("POST", "/api/v1/nodes", bad)
    st = Stack(cp, redis_server.url, "96", watchers=2)
    try:
        st.start()
        yield World(cp, st, run, s5000, badlabel)
    finally:
        st.stop()
        for n in (s5000, badlabel):
            cp.api("DELETE", f"/api/v1/nodes/{n}", ok=(200, 202, 404))



async def gauges(stack: Stack, index: int, **want: float) -> bool:
    """Whether watcher `index` exports these mtsched_node_mismatch values (reason=value)."""
    return await asyncio.to_thread(lambda: all(gauge(stack, index, k) == v for k, v in want.items()))


def gauge(stack: Stack, index: int, reason: str) -> float | None:
    m = re.search(rf'^mtsched_node_mismatch\{{reason="{reason}"\}} ([0-9.e+-]+)$',
                  stack.metrics(stack.role("watcher", index)), re.M)
    return float(m.group(1)) if m else None


async def node_events(kube: Kube, node: str) -> list[dict[str, Any]]:
    listed = await kube.request("GET", "/api/v1/namespaces/default/events",
                                query={"fieldSelector": f"involvedObject.kind=Node,involvedObject.name={node}"})
    return [e for e in listed["items"] if e["reason"] == "NodeCardMismatch"]


def slice_pod(name: str, run: str, memory: int, cores: int = 2, key: str = LABEL) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeSelector": {key: run}, "containers": [{
                "name": "c", "image": "busybox",
                "resources": {"limits": {VGPU: "1", MEM: str(memory), CORE: str(cores)}}}]}}


async def create_with_warnings(kube: Kube, ns: str, pod: dict[str, Any], dry_run: bool = False) -> list[str]:
    """Create the pod; the admission warnings the API server relays (Warning headers, code 299)."""
    resp = await kube.raw("POST", f"/api/v1/namespaces/{ns}/pods", pod, query={"dryRun": "All"} if dry_run else None)
    async with resp:
        body = await resp.read()
        assert resp.status == 201, body
        return list(resp.headers.getall("Warning", []))


@pytest_asyncio.fixture
async def kube(world: World) -> AsyncIterator[Kube]:
    k = await Kube.create(str(world.cp.kubeconfig_path))
    yield k
    await k.close()


async def new_namespace(kube: Kube) -> str:
    ns = f"e2e-explain-{uuid.uuid4().hex[:6]}"
    await kube.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    return ns


async def test_mismatched_nodes_are_loud(world: World, kube: Kube) -> None:
    st = world.stack
    # the gauge, on every watcher replica
    for i in (0, 1):
        await until_true(lambda i=i: gauges(st, i, model=1, label=1), f"watcher-{i} gauge")  # type: ignore[misc]
        assert await gauges(st, i, capacity=0, annotation=0)
    # the line at the first list
    for i in (0, 1):
        log = (st.dir / f"watcher-{i}.log").read_text()
        line = next(x for x in log.splitlines() if "report sliced cards but offer none" in x)
        print(f"\n--- watcher-{i} log ---\n{line}")
        assert "2 node(s)" in line and world.s5000 in line and world.badlabel in line and S5000_ERROR in line
    # a Warning event on each node
    ev = await until_true(lambda: node_events(kube, world.s5000), "event on the S5000 node")
    print(f"\n--- node event ---\n{ev[0]['type']} {ev[0]['reason']} {ev[0]['message']}")
    assert ev[0]["type"] == "Warning" and S5000_ERROR in ev[0]["message"] and "model mismatch" in ev[0]["message"]
    ev = await until_true(lambda: node_events(kube, world.badlabel), "event on the mislabelled node")
    assert "label mismatch" in ev[0]["message"] and "lists 3 cards" in ev[0]["message"]

    # a slice pod that only these nodes could take: admitted, with a warning naming them
    ns = await new_namespace(kube)
    warnings = await create_with_warnings(kube, ns, slice_pod("only-mismatched", world.run, 32))
    text = " | ".join(warnings)
    print("\n--- admission warnings ---\n" + "\n".join(warnings))  # the README shows these
    assert "stays Pending" in text and f"node {world.s5000}: {S5000_ERROR}" in text, warnings
    assert f"node {world.badlabel}: label" in text

    # a node heartbeat-like change repeats nothing; fixing the label clears it (gauge to 0 on both replicas)
    await kube.request("PATCH", f"/api/v1/nodes/{world.s5000}", {"metadata": {"annotations": {"touch": "1"}}},
                       content_type="application/merge-patch+json")
    await kube.request("PATCH", f"/api/v1/nodes/{world.badlabel}",
                       {"metadata": {"labels": {simulated.LABEL_SLICED_CORES: "0-1"}}},
                       content_type="application/merge-patch+json")
    for i in (0, 1):
        await until_true(lambda i=i: gauges(st, i, label=0), f"watcher-{i} sees the fix")  # type: ignore[misc]
        assert await gauges(st, i, model=1)
    # both replicas handled the touch before the fix: still one event per node, not one per replica or change
    assert len(await node_events(kube, world.s5000)) == 1
    assert len(await node_events(kube, world.badlabel)) == 1

    # the fixed node is an S4000 the webhook's mirror now reports: no mismatch warning any more
    async def quiet() -> bool:
        got = await create_with_warnings(kube, ns, slice_pod("dry", world.run, 32), dry_run=True)
        return not any("stays Pending" in w for w in got)
    await until_true(quiet, "the warning goes once a usable card exists")
    await kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods", ok=(200, 202, 404), query={"gracePeriodSeconds": "0"})


def client_ctx(cp: ControlPlane, cert: bool = True) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(cp.pki.ca_crt))
    if cert:
        ctx.load_cert_chain(cp.pki.client_crt, cp.pki.client_key)
    return ctx


def run_cli(world: World, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "controller.cli", "explain", *args, "--config", str(world.stack.config_path),
            "--kubeconfig", str(world.cp.kubeconfig_path), "--log-format", "text"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


async def test_explain_a_pod_pending_on_full_cards(world: World, kube: Kube) -> None:
    cp, st = world.cp, world.stack
    # the pods' pool: a one-card S4000 node and the S5000 node (still closed); the other node is no candidate
    # kube-scheduler counts node totals: the pool's node has 64 units free in all, but 32 on each card
    full, pool = f"s4000-full-{world.run}", uuid.uuid4().hex[:6]
    await kube.request("POST", "/api/v1/nodes",
                       simulated.gpu_node(full, simulated.S4000_MEMORY_UNITS, sliced_cards=2, labels={POOL: pool}))
    await kube.request("PATCH", f"/api/v1/nodes/{world.s5000}", {"metadata": {"labels": {POOL: pool}}},
                       content_type="application/merge-patch+json")
    ns = await new_namespace(kube)
    try:
        for batch in (("d",), ("a", "b")):  # d (64) takes card 1 (ties: highest index), a and b card 0 (spread)
            for name in batch:
                memory = 64 if name == "d" else 32
                await kube.request("POST", f"/api/v1/namespaces/{ns}/pods", slice_pod(name, pool, memory, key=POOL))

            async def bound(batch: tuple[str, ...] = batch) -> bool:
                pods = [await kube.get_pod(ns, n) for n in batch]
                return all(p["spec"].get("nodeName") == full for p in pods)
            await until_true(bound, f"{batch} bound to the pool's node")
        await kube.request("POST", f"/api/v1/namespaces/{ns}/pods", slice_pod("c", pool, 64, key=POOL))

        async def filtered() -> list[str]:
            listed = await kube.request("GET", f"/api/v1/namespaces/{ns}/events")
            return [e["message"] for e in listed["items"] if e["involvedObject"]["name"] == "c"
                    and e["reason"] == "FilteringFailed" and f"CardInsufficientMemory({full})" in e["message"]]
        msgs = await until_true(filtered, "c rejected by the filter, with HAMi's reason text")
        assert f"node unregistered: {S5000_ERROR}({world.s5000})" in msgs[0], msgs
        print(f"\n--- FilteringFailed ---\n{msgs[0]}")
        # the CLI: the pod from the API server, the cards from Redis
        out = await asyncio.to_thread(run_cli, world, f"{ns}/c")
        assert out.returncode == 0, out.stderr
        text = out.stdout
        print(f"\n--- mtsched explain {ns}/c ---\n{text}")  # the README shows this output
        assert "request: slice of one card: 64 units (32 GiB) of memory, 2 core group(s), 1 slice(s)" in text
        assert f"node {full}: 2/2 CardInsufficientMemory" in text
        assert (f"card 0 (MTT S4000, 64/96 units, 4/16 cores, 2/16 slices, ok): CardInsufficientMemory: needs 64 "
                f"units, 32 free; held by {ns}/a (32), {ns}/b (32)") in text
        assert (f"card 1 (MTT S4000, 64/96 units, 2/16 cores, 1/16 slices, ok): CardInsufficientMemory: needs 64 "
                f"units, 32 free; held by {ns}/d (64)") in text
        assert f"to fit: fits once {ns}/a ends" in text and f"to fit: fits once {ns}/d ends" in text
        assert f"node {world.s5000}: offers no card (model mismatch): {S5000_ERROR}" in text
        assert "verdict: no card fits on any of 2 candidate node(s)" in text and "offer no card because" in text
        assert f"node {world.badlabel}: not a candidate: it does not match the pod's nodeSelector" in text
        js = await asyncio.to_thread(run_cli, world, f"{ns}/c", "-o", "json")
        assert js.returncode == 0, js.stderr
        doc = orjson.loads(js.stdout)
        by = {n["node"]: n for n in doc["nodes"]}
        card = by[full]["cards"][0]
        assert card["reason"] == "CardInsufficientMemory" and card["memory_used"] == 64
        assert sorted(h["pod"] for h in card["holders"]) == [f"{ns}/a", f"{ns}/b"]
        assert by[world.s5000]["mismatch"] == "model"

        # the endpoint on the extender's API port: the same data from its mirror, behind mutual TLS
        url = f"https://127.0.0.1:{st.role('extender').port}/debug/explain"
        async with aiohttp.ClientSession() as http:
            async def same() -> dict[str, Any] | None:
                async with http.get(url, params={"pod": f"{ns}/c"}, ssl=client_ctx(cp)) as resp:
                    assert resp.status == 200, await resp.text()
                    got: dict[str, Any] = orjson.loads(await resp.read())
                return got if got["nodes"] == doc["nodes"] else None
            got = await until_true(same, "the endpoint answers what the CLI answers")
            assert got["summary"] == doc["summary"] and got["request"] == doc["request"]
            async with http.get(url, params={"pod": f"{ns}/c", "output": "text"}, ssl=client_ctx(cp)) as resp:
                assert resp.status == 200 and (await resp.text()).strip() == text.strip()
            async with http.get(url, params={"pod": "no-slash"}, ssl=client_ctx(cp)) as resp:
                assert resp.status == 400 and "allowed: NAMESPACE/NAME" in (await resp.json())["error"]
            async with http.get(url, params={"pod": f"{ns}/nobody"}, ssl=client_ctx(cp)) as resp:
                assert resp.status == 404, await resp.text()
            with pytest.raises(aiohttp.ClientError):  # no client certificate: no handshake, as for /filter
                async with http.get(url, params={"pod": f"{ns}/c"}, ssl=client_ctx(cp, cert=False)) as resp:
                    await resp.read()
        # the CLI on a pod that does not exist: an error, not a traceback
        missing = await asyncio.to_thread(run_cli, world, f"{ns}/nobody")
        assert missing.returncode == 1 and "cannot read pod" in missing.stderr and "Traceback" not in missing.stderr
    finally:
        await kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods", ok=(200, 202, 404),
                           query={"gracePeriodSeconds": "0"})
        await kube.request("DELETE", f"/api/v1/nodes/{full}", ok=(200, 202, 404))
