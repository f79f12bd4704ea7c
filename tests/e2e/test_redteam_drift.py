"""Red team: out-of-band edits to Redis that the reconciler never repairs (docs/architecture.md, "The ledger
heals itself": "out-of-band edits to Redis are repaired", within the documented bound).

1. A node removed from the `mt:nodes` set (its keys intact): `diff_node` compares a node's keys with the
   API but never the set, so the reconciler finds nothing to do; the mirrors drop the node at their next
   resync and the extender answers "node unregistered" for it from then on: its cards are lost to
   scheduling until a watcher restarts. (The same state is left by `Ledger.remove_node`, script then
   SREM, racing another watcher's re-creation of the node.)
2. A reservation stamped in the future on Redis's clock (an edit, or a failover to a Redis whose clock is
   behind the old master's): `diff_node` calls it "settling" (younger than the keep window) for as long as
   the stamp is ahead, `replace_node.lua` keeps it for the same reason, and the janitor's age test never
   passes: it books its card for good, although no pod exists.

Real parts: this module's own control plane, a real redis-server, the roles as processes under the
chart's identities (2 watchers, 1 extender, 1 webhook), kube-scheduler calling the extender.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from redis.asyncio import Redis

from deploy.local import nodes as simulated
from deploy.local.controlplane import ControlPlane
from deploy.local.redis import RedisServer
from deploy.local.stack import Stack
from shared.kube import Kube
from shared.store.ledger import Ledger

pytestmark = [pytest.mark.e2e, pytest.mark.faults]

CONVERGE_BOUND = 60.0  # tests/e2e/test_faults.py, docs/runbooks.md
MIRROR_RESYNC = 30.0  # shared/store/mirror.py resync_seconds


@pytest.fixture(scope="module")
def redis_own() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.cleanup()


@pytest.fixture(scope="module")
def stack(own_control_plane: ControlPlane, redis_own: RedisServer) -> Iterator[Stack]:
    with Stack(own_control_plane, redis_own.url, "96,160", extenders=1, webhooks=1, watchers=2,
               settings={"reconcileSeconds": 5, "pendingTTLSeconds": 30}).running() as st:
        yield st


async def make_node(kube: Kube, client: Redis) -> str:
    name = f"rt-{uuid.uuid4().hex[:6]}"
    await kube.request("POST", "/api/v1/nodes", simulated.gpu_node(name, 96, 4))
    for _ in range(100):
        if await client.sismember("mt:nodes", name) and await client.exists(f"mt:{{{name}}}:card:3"):
            return name
        await asyncio.sleep(0.3)
    raise AssertionError(f"the watchers never wrote node {name}")


def pinned_pod(name: str, node: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "c", "image": "busybox", "resources": {"limits": {
                         "mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "8", "mthreads.com/sgpu-core": "2"}}}]}}


async def cleanup(kube: Kube, client: Redis, ns: str, node: str) -> None:
    """The pod `p` of `ns` and the node go, and both clients close."""
    await kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods/p", {"gracePeriodSeconds": 0}, ok=(200, 202, 404))
    if node:
        await kube.request("DELETE", f"/api/v1/nodes/{node}", ok=(200, 202, 404))
    await kube.close()
    await client.aclose()


async def test_a_node_dropped_from_the_node_set_is_listed_again(stack: Stack, redis_own: RedisServer) -> None:
    kube = await Kube.create(str(stack.cp.kubeconfig_path))
    client = Redis.from_url(redis_own.url, decode_responses=True)
    ns = f"rt-{uuid.uuid4().hex[:6]}"
    node = ""
    try:
        await kube.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
        node = await make_node(kube, client)
        await client.srem("mt:nodes", node)
        t0 = time.monotonic()
        for _ in range(int(CONVERGE_BOUND * 2)):
            if await client.sismember("mt:nodes", node):
                break
            await asyncio.sleep(0.5)
        listed = bool(await client.sismember("mt:nodes", node))
        # what it costs: past the mirrors' resync, a pod that fits only there
        await asyncio.sleep(max(0.0, MIRROR_RESYNC + 5 - (time.monotonic() - t0)))
        await kube.request("POST", f"/api/v1/namespaces/{ns}/pods", pinned_pod("p", node))
        t1 = time.monotonic()
        pod: dict[str, Any] = {}
        while time.monotonic() - t1 < 30:
            pod = await kube.get_pod(ns, "p")
            if pod["spec"].get("nodeName"):
                break
            await asyncio.sleep(0.5)
        why = [c.get("message") for c in (pod.get("status") or {}).get("conditions") or []]
        assert listed, (f"node {node} was dropped from mt:nodes and not listed again within {CONVERGE_BOUND}s; "
                        f"a pod that fits only there: bound={pod['spec'].get('nodeName')!r} {why}")
        assert pod["spec"].get("nodeName") == node, f"the pod was not placed on {node}: {why}"
    finally:
        await cleanup(kube, client, ns, node)


@pytest.mark.parametrize("state", ["bound", "pending"])
async def test_a_reservation_stamped_in_the_future_is_not_kept_for_good(stack: Stack, redis_own: RedisServer,
                                                                        state: str) -> None:
    kube = await Kube.create(str(stack.cp.kubeconfig_path))
    client = Redis.from_url(redis_own.url, decode_responses=True)
    node = ""
    uid = f"rt-future-{state}"
    try:
        node = await make_node(kube, client)
        base = f"mt:{{{node}}}"
        sec, usec = await client.time()
        ahead = (int(sec) * 1000 + int(usec) // 1000) + 3_600_000  # an hour ahead of Redis's clock
        fields: dict[str, Any] = {"cards": "2", "mem": 16, "cores": 4, "slices": 1, "state": state,
                                  "created": ahead, "pod": "default/nobody"}
        if state == "bound":
            fields["bound_at"] = ahead
        await client.hset(f"{base}:res:{uid}", mapping=fields)
        await client.sadd(f"{base}:pods", uid)
        for field, by in (("mem_used", 16), ("mem_free", -16), ("cores_used", 4), ("cores_free", -4), ("slices", 1)):
            await client.hincrby(f"{base}:card:2", field, by)  # consistent usage: only the stamp is off
        # the bound: the reconciler's pass (5 s here), the keep window (10 s), the janitor's TTL (30 s)
        limit = CONVERGE_BOUND + 30
        for _ in range(int(limit)):
            if not await client.sismember(f"{base}:pods", uid):
                break
            await asyncio.sleep(1)
        card = await client.hgetall(f"{base}:card:2")
        assert not await client.sismember(f"{base}:pods", uid), (
            f"a {state} reservation of no pod, stamped an hour ahead, still books card 2 of {node} after "
            f"{limit:.0f}s: {card}")
    finally:
        if node:
            await client.delete(f"mt:{{{node}}}:res:{uid}")
            await client.srem(f"mt:{{{node}}}:pods", uid)
            await kube.request("DELETE", f"/api/v1/nodes/{node}", ok=(200, 202, 404))
        await kube.close()
        await client.aclose()


async def test_a_repair_that_frees_cards_lets_a_parked_pod_in_at_once(stack: Stack, redis_own: RedisServer) -> None:
    """Stale bookings of pods that do not exist fill every card of a node (settling: younger than the keep
    window, so kept at first). A pod that fits only there is refused by our filter and parked by kube-scheduler,
    which retries extender-refused pods only on a cluster event. The reconciler's repair frees the cards and
    nudges kube-scheduler about the node: the pod binds within seconds, not at kube-scheduler's 5-minute flush
    of parked pods (nothing else happens in this plane meanwhile)."""
    kube = await Kube.create(str(stack.cp.kubeconfig_path))
    client = Redis.from_url(redis_own.url, decode_responses=True)
    ns = f"rt-{uuid.uuid4().hex[:6]}"
    node = ""
    stale = [f"rt-stale-{i}" for i in range(4)]
    try:
        await kube.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
        node = await make_node(kube, client)
        base = f"mt:{{{node}}}"
        ledger = Ledger(client)
        await ledger.load_scripts()
        for card, uid in enumerate(stale):  # through the scripts: every mirror has them (the feed)
            out, _ = await ledger.reserve(node, uid, [card], 96, 4, 1, pod=f"{ns}/nobody-{card}")
            assert out.ok, out
            assert await ledger.mark_bound(node, uid)
        await kube.request("POST", f"/api/v1/namespaces/{ns}/pods", pinned_pod("p", node))

        # refused for the cards the stale bookings held (the pod may go nowhere else): a FilteringFailed event
        # naming a card reason for this node says so itself (whether they are still booked when it is read is a
        # race with the repair, which may come any moment from then)
        for_cards = re.compile(rf"nodes (Card\w+|NodeInsufficientDevice)\([^)]*{re.escape(node)}")

        async def refused() -> list[str]:
            events = (await kube.request("GET", f"/api/v1/namespaces/{ns}/events"))["items"]
            return [str(e.get("message")) for e in events
                    if e["reason"] == "FilteringFailed" and e["involvedObject"]["name"] == "p"]

        said: list[str] = []
        for _ in range(40):
            said = await refused()
            if any(for_cards.search(m) for m in said):
                break
            await asyncio.sleep(0.25)
        assert any(for_cards.search(m) for m in said), f"the pod was never refused by the filter for cards: {said}"
        t0 = time.monotonic()
        bound_within = 45.0  # keep window 10 s + a pass (5 s) + the nudge (0.5 s) + kube-scheduler's backoff (<= 10 s)
        pod: dict[str, Any] = {}
        while time.monotonic() - t0 < bound_within:
            pod = await kube.get_pod(ns, "p")
            if pod["spec"].get("nodeName"):
                break
            await asyncio.sleep(0.5)
        left = [uid for uid in stale if await client.sismember(f"{base}:pods", uid)]
        assert pod["spec"].get("nodeName") == node, (
            f"not bound {bound_within:.0f}s after the refusal; stale bookings left: {left}; "
            f"{(pod.get('status') or {}).get('conditions')}")
        assert not left
    finally:
        await cleanup(kube, client, ns, node)
