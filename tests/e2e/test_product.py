"""The product end to end: real etcd + kube-apiserver + kube-scheduler, real Redis, our three roles
as processes serving HTTPS (webhook called by the apiserver, extender called by kube-scheduler).

Each memoryPerCard configuration ([96], [160], [96, 160]) gets its own stack and its own nodes; pods
carry a nodeSelector for their scenario's nodes, so scenarios never see each other's cards.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from redis.asyncio import Redis

from deploy.local import nodes as simulated
from deploy.local.controlplane import ControlPlane
from deploy.local.redis import RedisServer
from deploy.local.stack import Stack
from shared.domain.annotations import (
    ALLOCATED,
    BIND_PHASE,
    GPU_INDEX,
    PREDICATE_NODE,
    PREDICATE_TIME,
    VGPU_NODE,
    VGPU_TIME,
    decode_allocation,
)
from shared.domain.models import valid_memory_values
from shared.domain.state import NodeSnapshot
from shared.kube import Kube, KubeError
from shared.store.ledger import Ledger

pytestmark = pytest.mark.e2e

SCENARIO_LABEL = "mtsched.io/e2e-scenario"
VGPU, MEM, CORE, GPU = "mthreads.com/vgpu", "mthreads.com/sgpu-memory", "mthreads.com/sgpu-core", "mthreads.com/gpu"


@pytest.fixture(scope="module", params=["96", "160", "96,160"], ids=["s4000", "s5000", "mixed"])
def stack(request: pytest.FixtureRequest, control_plane: ControlPlane,
          redis_server: RedisServer) -> Iterator[Stack]:
    mixed = request.param == "96,160"
    with Stack(control_plane, redis_server.empty().url, request.param, extenders=2 if mixed else 1,
               webhooks=2 if mixed else 1, watchers=2 if mixed else 1).running() as st:
        yield st


class Cluster:
    """One scenario's nodes and namespace, with helpers to create pods and read the results."""

    def __init__(self, kube: Kube, ledger: Ledger, memory_per_card: str):
        self.kube = kube
        self.ledger = ledger
        self.models = [int(x) for x in memory_per_card.split(",")]
        self.id = uuid.uuid4().hex[:6]
        self.ns = f"e2e-{self.id}"
        self.nodes: list[str] = []

    @classmethod
    @contextlib.asynccontextmanager
    async def opened(cls, stack: Stack, redis_url: str) -> AsyncIterator[Cluster]:
        """A scenario on `stack` with its own API client and ledger, its pods and nodes deleted after."""
        kube = await Kube.create(str(stack.cp.kubeconfig_path))
        client = Redis.from_url(redis_url, decode_responses=True)
        try:
            ledger = Ledger(client)
            await ledger.load_scripts()
            c = cls(kube, ledger, stack.memory_per_card)
            await c.setup()
            try:
                yield c
            finally:
                await c.cleanup()
        finally:
            await client.aclose()
            await kube.close()

    async def setup(self) -> None:
        await self.kube.request("POST", "/api/v1/namespaces", {"metadata": {"name": self.ns}})

    async def add_node(self, model: int, cards: int = 2, whole: int = 0, card_ids: list[int] | None = None) -> str:
        name = f"{'s4000' if model == 96 else 's5000'}-{self.id}-{len(self.nodes)}"
        node = simulated.gpu_node(name, model, cards, whole, card_ids, labels={SCENARIO_LABEL: self.id})
        await self.kube.request("POST", "/api/v1/nodes", node)
        self.nodes.append(name)
        await self.wait_ledger(lambda s: name in s and len(s[name].cards) == cards)
        return name

    async def snapshots(self) -> dict[str, NodeSnapshot]:
        return {k: v for k, v in (await self.ledger.snapshots(self.nodes)).items()}

    async def wait_ledger(self, ok: Any, timeout: float = 20.0) -> dict[str, NodeSnapshot]:
        deadline = time.monotonic() + timeout
        while True:
            snaps = await self.ledger.snapshots(self.nodes)
            if ok(snaps):
                return snaps
            if time.monotonic() > deadline:
                raise AssertionError(f"ledger never reached the expected state: {snaps}")
            await asyncio.sleep(0.2)

    def pod(self, name: str, *limits: dict[str, Any], annotations: dict[str, str] | None = None,
            init: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "nodeSelector": {SCENARIO_LABEL: self.id},
            "containers": [{"name": f"c{i}", "image": "busybox", "resources": {"limits": {k: str(v) for k, v in
                                                                                         lim.items()}}}
                           for i, lim in enumerate(limits)]}
        if init:
            spec["initContainers"] = [{"name": f"init{i}", "image": "busybox",
                                       "resources": {"limits": {k: str(v) for k, v in lim.items()}}}
                                      for i, lim in enumerate(init)]
        meta: dict[str, Any] = {"name": name}
        if annotations:
            meta["annotations"] = annotations
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}

    async def create(self, pod: dict[str, Any]) -> dict[str, Any]:
        created: dict[str, Any] = await self.kube.request("POST", f"/api/v1/namespaces/{self.ns}/pods", pod)
        return created

    async def rejection(self, pod: dict[str, Any]) -> str:
        with pytest.raises(KubeError) as info:
            await self.create(pod)
        assert info.value.status == 403, info.value
        return str(info.value.body.get("message"))

    async def get(self, name: str) -> dict[str, Any]:
        return await self.kube.get_pod(self.ns, name)  # type: ignore[no-any-return]

    async def wait_bound(self, *names: str, timeout: float = 30.0) -> dict[str, dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            pods = {n: await self.get(n) for n in names}
            if all(p["spec"].get("nodeName") for p in pods.values()):
                return pods
            if time.monotonic() > deadline:
                unbound = [n for n, p in pods.items() if not p["spec"].get("nodeName")]
                raise AssertionError(f"not bound: {unbound}; events: {await self.events()}")
            await asyncio.sleep(0.2)

    async def events(self, name: str | None = None) -> list[str]:
        listed = await self.kube.request("GET", f"/api/v1/namespaces/{self.ns}/events")
        return [f"{e['reason']}: {e['message']}" for e in listed["items"]
                if name is None or e["involvedObject"].get("name") == name]

    async def delete(self, name: str) -> None:
        await self.kube.request("DELETE", f"/api/v1/namespaces/{self.ns}/pods/{name}",
                                {"gracePeriodSeconds": 0}, ok=(200, 202, 404))

    async def cleanup(self) -> None:
        listed = await self.kube.request("GET", f"/api/v1/namespaces/{self.ns}/pods")
        for p in listed["items"]:
            await self.delete(p["metadata"]["name"])
        for n in self.nodes:
            await self.kube.request("DELETE", f"/api/v1/nodes/{n}", ok=(200, 202, 404))


def grants(pod: dict[str, Any]) -> list[list[Any]]:
    return decode_allocation(pod["metadata"]["annotations"][ALLOCATED])


# -- admission: valid and invalid values per configuration ---------------------------------------

async def test_valid_and_invalid_memory_values(cluster: Cluster) -> None:
    union = sorted({v for m in cluster.models for v in valid_memory_values(m)})
    for m in cluster.models:
        await cluster.add_node(m, cards=1)
    for v in union:
        created = await cluster.create(cluster.pod(f"ok-{v}", {VGPU: 1, MEM: v, CORE: 2}))
        assert created["spec"]["schedulerName"] == "hami-scheduler"
    for v in (3, 1, 48, 100, 320, *(x for x in (96, 128, 160) if x not in union)):
        msg = await cluster.rejection(cluster.pod(f"bad-{v}", {VGPU: 1, MEM: v, CORE: 2}))
        assert f"mthreads.com/sgpu-memory={v}" in msg and 'container "c0"' in msg, msg
        assert "allowed: " + ", ".join(map(str, union)) in msg, msg
    msg = await cluster.rejection(cluster.pod("cores-17", {VGPU: 1, MEM: 2, CORE: 17}))
    assert "mthreads.com/sgpu-core=17" in msg and "1..16" in msg
    msg = await cluster.rejection(cluster.pod("frac", {VGPU: 1, MEM: "1.5", CORE: 2}))
    assert "1.5" in msg and "whole number" in msg
    # the default core count is injected for slices that leave it out
    created = await cluster.create(cluster.pod("no-cores", {VGPU: 1, MEM: 2}))
    assert created["spec"]["containers"][0]["resources"]["limits"][CORE] == "1"


async def test_exclusive_gets_the_whole_card_of_its_node(cluster: Cluster) -> None:
    nodes = {m: await cluster.add_node(m, cards=1) for m in cluster.models}
    created = await cluster.create(cluster.pod("excl", {VGPU: 1}))
    limits = created["spec"]["containers"][0]["resources"]["limits"]
    biggest = max(cluster.models)
    assert limits == {VGPU: "1", MEM: str(biggest), CORE: "16"}
    pod = (await cluster.wait_bound("excl"))["excl"]
    assert pod["spec"]["nodeName"] == nodes[biggest]
    (g,), = grants(pod)
    assert (g.memory_mib, g.cores) == (biggest * 512, 16)
    if len(cluster.models) > 1:  # mixed fleet: pinning the S4000 model
        small = min(cluster.models)
        created = await cluster.create(cluster.pod("excl-small", {VGPU: 1},
                                                   annotations={"mtsched.io/card-memory": str(small)}))
        assert created["spec"]["containers"][0]["resources"]["limits"][MEM] == str(small)
        pod = (await cluster.wait_bound("excl-small"))["excl-small"]
        assert pod["spec"]["nodeName"] == nodes[small]
        assert grants(pod)[0][0].memory_mib == small * 512


async def test_multi_card_takes_whole_cards(cluster: Cluster) -> None:
    model = max(cluster.models)
    node = await cluster.add_node(model, cards=3)
    created = await cluster.create(cluster.pod("multi", {VGPU: 2}))
    assert created["spec"]["containers"][0]["resources"]["limits"] == {VGPU: "2", MEM: str(2 * model), CORE: "32"}
    msg = await cluster.rejection(cluster.pod("multi-slice", {VGPU: 2, MEM: 8, CORE: 4}))
    assert "whole cards" in msg
    pod = (await cluster.wait_bound("multi"))["multi"]
    (cards,) = grants(pod)
    assert len({g.device_id for g in cards}) == 2
    assert all((g.memory_mib, g.cores) == (model * 512, 16) for g in cards)
    assert pod["metadata"]["annotations"][GPU_INDEX] == ",".join(str(g.index) for g in cards)
    snap = (await cluster.snapshots())[node]
    assert sorted(c.mem_used for c in snap.cards.values()) == [0, model, model]


async def test_one_card_per_pod_across_containers(cluster: Cluster) -> None:
    await cluster.add_node(min(cluster.models), cards=2)
    await cluster.create(cluster.pod("pair", {VGPU: 1, MEM: 16, CORE: 4}, {VGPU: 1, MEM: 8, CORE: 2},
                                     init=[{VGPU: 1, MEM: 32, CORE: 8}]))
    pod = (await cluster.wait_bound("pair"))["pair"]
    per_container = grants(pod)
    assert len(per_container) == 3  # init first, then the two app containers
    assert len({g.device_id for c in per_container for g in c}) == 1
    snap = next(iter((await cluster.snapshots()).values()))
    used = [c for c in snap.cards.values() if c.mem_used]
    # the pod books its peak: max(init 32, app 16 + 8) units and max(8, 4 + 2) cores
    assert [(c.mem_used, c.cores_used, c.slices) for c in used] == [(32, 8, 2)]


async def test_whole_gpu_alone_untouched_and_mixing_rejected(cluster: Cluster) -> None:
    await cluster.add_node(min(cluster.models), cards=1, whole=2)
    created = await cluster.create(cluster.pod("whole", {GPU: 1}))
    assert created["spec"]["schedulerName"] == "default-scheduler"
    assert created["spec"]["containers"][0]["resources"]["limits"] == {GPU: "1"}
    pod = (await cluster.wait_bound("whole"))["whole"]
    assert ALLOCATED not in (pod["metadata"].get("annotations") or {})
    msg = await cluster.rejection(cluster.pod("mix", {GPU: 1, VGPU: 1, MEM: 2, CORE: 1}))
    assert "mthreads.com/gpu cannot be mixed" in msg and 'container "c0"' in msg


async def test_binding_carries_every_annotation(cluster: Cluster) -> None:
    node = await cluster.add_node(max(cluster.models), cards=1)
    await cluster.create(cluster.pod("annotated", {VGPU: 1, MEM: 8, CORE: 3}))
    pod = (await cluster.wait_bound("annotated"))["annotated"]
    ann = pod["metadata"]["annotations"]
    assert ann[ALLOCATED] == f"{node}-mthreads-0,Mthreads,4096,3:;"
    assert ann[GPU_INDEX] == "0" and ann[PREDICATE_NODE] == node and ann[VGPU_NODE] == node
    assert ann[BIND_PHASE] == "allocating"
    assert int(ann[PREDICATE_TIME]) > 10**18 and int(ann[VGPU_TIME]) > 10**9
    # kube-scheduler's own event says where the pod went (sent once our bind answered: wait, bounded);
    # our BindingSucceed is off by default (successEvents), so by then there is none
    deadline = time.monotonic() + 30
    while True:
        evs = await cluster.events("annotated")
        if any(e.startswith("Scheduled: ") and node in e for e in evs):
            break
        assert time.monotonic() < deadline, evs
        await asyncio.sleep(0.2)
    assert not any("BindingSucceed" in e for e in evs), evs


# -- capacity: pending with reasons, release on delete / completion ------------------------------

async def test_full_cluster_pending_then_scheduled_after_delete(cluster: Cluster) -> None:
    node = await cluster.add_node(min(cluster.models), cards=2)
    # 10 + 10 core groups land on two cards (card spread); 10 more fit the node's 12 free core groups
    # (kube-scheduler's own NodeResourcesFit passes) but no single card: only the extender sees that.
    await cluster.create(cluster.pod("first", {VGPU: 1, MEM: 2, CORE: 10}))
    await cluster.create(cluster.pod("other", {VGPU: 1, MEM: 2, CORE: 10}))
    await cluster.wait_bound("first", "other")
    await cluster.create(cluster.pod("second", {VGPU: 1, MEM: 2, CORE: 10}))
    deadline = time.monotonic() + 30
    while not (evs := [e for e in await cluster.events("second") if e.startswith("FilteringFailed")]):
        assert time.monotonic() < deadline, await cluster.events("second")
        await asyncio.sleep(0.3)
    assert any(f"1 nodes CardInsufficientCore({node})" in e for e in evs), evs
    assert not (await cluster.get("second"))["spec"].get("nodeName")
    await cluster.delete("first")
    pod = (await cluster.wait_bound("second", timeout=60))["second"]
    assert pod["spec"]["nodeName"] == node


async def test_deleted_and_completed_pods_release_their_share(cluster: Cluster) -> None:
    node = await cluster.add_node(max(cluster.models), cards=1)
    await cluster.create(cluster.pod("a", {VGPU: 1, MEM: 16, CORE: 4}))
    await cluster.create(cluster.pod("b", {VGPU: 1, MEM: 8, CORE: 2}))
    await cluster.wait_bound("a", "b")
    await cluster.wait_ledger(lambda s: s[node].cards[0].mem_used == 24)
    await cluster.delete("a")
    await cluster.wait_ledger(lambda s: s[node].cards[0].mem_used == 8 and s[node].cards[0].cores_used == 2)
    pod = await cluster.get("b")
    pod["status"]["phase"] = "Succeeded"
    await cluster.kube.request("PUT", f"/api/v1/namespaces/{cluster.ns}/pods/b/status", pod)
    snaps = await cluster.wait_ledger(lambda s: s[node].cards[0].mem_used == 0)
    assert snaps[node].cards[0].slices == 0 and not snaps[node].reservations


# -- resilience: controller restart and Redis flush ----------------------------------------------

async def test_restart_and_redis_flush_end_in_the_same_state(cluster: Cluster, stack: Stack) -> None:
    node = await cluster.add_node(max(cluster.models), cards=3)  # card spread: slices take two cards
    await cluster.create(cluster.pod("r1", {VGPU: 1, MEM: 32, CORE: 8}))
    await cluster.create(cluster.pod("r2", {VGPU: 1, MEM: 4, CORE: 1}))
    await cluster.create(cluster.pod("r3", {VGPU: 1}))
    await cluster.wait_bound("r1", "r2", "r3")

    def usage(snaps: dict[str, NodeSnapshot]) -> dict[int, tuple[int, int, int]]:
        return {i: (c.mem_used, c.cores_used, c.slices) for i, c in snaps[node].cards.items()}

    before = usage(await cluster.wait_ledger(lambda s: all(r.state == "bound" for r in s[node].reservations.values())
                                             and len(s[node].reservations) == 3))
    stack.restart("watcher")
    assert usage(await cluster.snapshots()) == before
    await cluster.ledger.redis.flushall()
    after = await cluster.wait_ledger(lambda s: node in s and len(s[node].reservations) == 3)
    assert usage(after) == before
    assert {r.pod.split("/")[1] for r in after[node].reservations.values()} == {"r1", "r2", "r3"}
    # and the extenders work on the rebuilt state
    await cluster.create(cluster.pod("r4", {VGPU: 1, MEM: 2, CORE: 1}))
    await cluster.wait_bound("r4")


# -- scale: 200 pods at once, replicas behind random routing -------------------------------------

async def test_200_pods_at_once_no_overcommit(cluster: Cluster, stack: Stack) -> None:
    if len(cluster.models) < 2:
        pytest.skip("run once, on the mixed fleet with two extender and two webhook replicas")
    assert stack.extenders == 2 and stack.webhooks == 2
    for m in (96, 96, 160, 160):
        await cluster.add_node(m, cards=4)
    rng = random.Random(7)
    pods = []
    for i in range(200):
        kind = rng.random()
        if kind < 0.8:
            limits = {VGPU: 1, MEM: rng.choice([2, 4, 8, 16, 32]), CORE: rng.choice([1, 1, 2, 4])}
        elif kind < 0.95:
            limits = {VGPU: 1}
        else:
            limits = {VGPU: 2}
        pods.append(cluster.pod(f"load-{i}", limits))
    sem = asyncio.Semaphore(40)

    async def create(p: dict[str, Any]) -> None:
        async with sem:
            await cluster.create(p)

    await asyncio.gather(*(create(p) for p in pods))

    from shared.config import load_config
    from shared.domain.fit import fit
    from shared.domain.request import pod_request

    cfg = load_config(env={}, flags={"memoryPerCard": stack.memory_per_card})

    def fits_somewhere(listed: list[dict[str, Any]], snaps: dict[str, NodeSnapshot]) -> dict[str, list[str]]:
        """Each pending pod that a card could take, with the nodes it fits on."""
        out: dict[str, list[str]] = {}
        for p in listed:
            if not p["spec"].get("nodeName"):
                req = pod_request(p, cfg)
                assert req is not None
                fitting = [n for n, s in snaps.items() if fit(s.card_states(), req, {}).ok]
                if fitting:
                    out[p["metadata"]["name"]] = fitting
        return out

    # settled: the ledger books exactly the pods bound, all of them bound there, and every pod still pending fits
    # nowhere (nothing was left pending that a card could take). Waited for as one condition, read again each
    # time: a pod turned away for a claim is tried again only after the claim lapses, a nudge and kube-scheduler's
    # backoff (up to ~20 s after the bind before it), so no quiet spell of the listing says the burst is over
    deadline = time.monotonic() + 150
    while True:
        listed = list((await cluster.kube.request("GET", f"/api/v1/namespaces/{cluster.ns}/pods"))["items"])
        bound = [p for p in listed if p["spec"].get("nodeName")]
        snaps = await cluster.ledger.snapshots(cluster.nodes)
        booked = [r for x in snaps.values() for r in x.reservations.values()]
        waiting = fits_somewhere(listed, snaps)
        if len(booked) == len(bound) and all(r.state == "bound" for r in booked) and not waiting:
            break
        assert time.monotonic() < deadline, (f"not settled: {len(bound)} bound, {len(booked)} booked "
                                             f"({sum(r.state != 'bound' for r in booked)} not bound), pending "
                                             f"but fitting: {waiting}")
        await asyncio.sleep(1.0)
    assert len(bound) >= 50, f"only {len(bound)} of 200 bound"
    per_card: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for p in bound:
        assert ALLOCATED in p["metadata"].get("annotations", {}), f"{p['metadata']['name']} bound without record"
        for g in grants(p)[0]:
            per_card[g.device_id][0] += g.memory_mib // 512
            per_card[g.device_id][1] += g.cores
            per_card[g.device_id][2] += 1
    for node, snap in snaps.items():
        for idx, card in snap.cards.items():
            used = per_card.get(f"{node}-mthreads-{idx}", [0, 0, 0])
            assert used[0] <= card.capacity and used[1] <= 16 and used[2] <= card.slice_limit, (node, idx, used)
            assert (card.mem_used, card.cores_used, card.slices) == tuple(used), (node, idx, used, card)
