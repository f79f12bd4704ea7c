"""A filter's claim that ends without its bind wakes the pods it turned away (real redis-server).

With one node returned, a replica's filter claims the card it fitted until the bind comes
(`Extender._claim`). kube-scheduler sends that bind to any replica; refused there, the claim on the
first replica stays until it lapses. A pod that replica turned away meanwhile is retried by
kube-scheduler only on a cluster event, and a claim lapsing is none: the CI run of 2026-12-04 ended
with a pod pending that fit. The replica now publishes a `wake` notice, and the watchers' Nudger
patches the node (the event). Two extender replicas and a watcher's mirror, each with its own
connections, on one Redis; only the API server is a recording stand-in (the node PATCH it receives).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

import controller.extender as extender_module
import controller.in_flight as in_flight_module
from controller.extender import Extender
from controller.nudger import Nudger
from shared.domain.node import node_inventory
from shared.store.ledger import Ledger
from tests.redis.conftest import MirrorFactory
from tests.redis.test_extender_bind import CFG, FakeKube, node, pod

pytestmark = pytest.mark.redis
ONE_NODE = dataclasses.replace(CFG, filter_top_k=1)  # the chart's default: one node returned, a claim made


class NodePatches:
    """The watcher's API client: records the nodes it is asked to patch."""

    def __init__(self) -> None:
        self.patched: list[str] = []

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        assert method == "PATCH" and path.startswith("/api/v1/nodes/"), (method, path)
        self.patched.append(path.rsplit("/", 1)[1])
        return {}


Stack = tuple[Extender, Extender, Ledger, NodePatches]


@pytest.fixture
async def stack(ledger: Ledger, mirror_factory: MirrorFactory,
                monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Stack]:
    monkeypatch.setattr(extender_module, "CLAIM_SECONDS", 0.5)  # the lapse, shortened; the rule is the same
    monkeypatch.setattr(in_flight_module, "CLAIM_TICK_SECONDS", 0.05)
    await ledger.upsert_node(node_inventory(node("s4k", 96, 1), CFG))  # one card of 96 units
    replicas = []
    for _ in range(2):  # each replica with its own ledger client and mirror
        m = await mirror_factory()
        replicas.append(Extender(ONE_NODE, m.ledger, m, FakeKube()))  # type: ignore[arg-type]
    a, b = replicas
    watcher_mirror = await mirror_factory()
    patches = NodePatches()
    nudger = Nudger(patches, interval=0.01, follow_up=0)  # type: ignore[arg-type]
    watcher_mirror.on_notice["wake"].append(nudger.nudge)
    tasks = [asyncio.create_task(e.expire_claims()) for e in (a, b)]
    yield a, b, ledger, patches
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for e in (a, b):
        await e.settled()


def shared_slice(uid: str, cores: int) -> dict[str, Any]:
    return pod(uid, {"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 16, "mthreads.com/sgpu-core": cores})


async def until(cond: Callable[[], bool], seconds: float = 5.0) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while loop.time() < deadline:
        if cond():
            return True
        await asyncio.sleep(0.02)
    return cond()


async def test_a_claim_refused_elsewhere_wakes_the_pod_it_turned_away(stack: Stack) -> None:
    a, b, ledger, patches = stack
    y, x = shared_slice("y", 12), shared_slice("x", 8)
    assert a.filter({"Pod": y, "NodeNames": ["s4k"]})["NodeNames"] == ["s4k"]  # y claims 12 of 16 cores on a
    assert a.filter({"Pod": x, "NodeNames": ["s4k"]})["NodeNames"] == []  # 12 + 8 > 16: x turned away
    # another pod booked 8 cores meanwhile (its filter and bind on b): y's bind, on b, no longer fits
    assert (await ledger.reserve("s4k", "z", [0], 16, 8, 1, pod="ns/p-z"))[0].ok
    b.kube.pods[("ns", "p-y")] = y  # type: ignore[union-attr]  # b's bind reads the pod it did not filter
    out = await b.bind({"PodName": "p-y", "PodNamespace": "ns", "PodUID": "y", "Node": "s4k"})
    assert out["Error"].startswith("no card on s4k")
    # x fits now (8 + 8 of 16 cores), yet kube-scheduler would retry it only on an event: a's claim lapses
    # unused and the watchers patch the node
    assert await until(lambda: patches.patched == ["s4k"]), patches.patched
    assert a.held == {} and not a._claims
    out = a.filter({"Pod": x, "NodeNames": ["s4k"]})
    assert out["NodeNames"] == ["s4k"], (out, a.mirror.get("s4k"))


async def test_a_claim_its_bind_took_over_wakes_nobody(stack: Stack) -> None:
    a, _b, _ledger, patches = stack
    y, x = shared_slice("y", 12), shared_slice("x", 8)
    assert a.filter({"Pod": y, "NodeNames": ["s4k"]})["NodeNames"] == ["s4k"]
    assert a.filter({"Pod": x, "NodeNames": ["s4k"]})["NodeNames"] == []
    assert (await a.bind({"PodName": "p-y", "PodNamespace": "ns", "PodUID": "y", "Node": "s4k"}))["Error"] == ""
    await a.settled()
    # the card really is taken: x was rightly turned away, and no wake is sent once the claim would have lapsed
    assert await until(lambda: not a._claims)
    await asyncio.sleep(0)  # a wake task, had one been made, gets to publish
    assert not await until(lambda: bool(patches.patched), seconds=1.0), patches.patched


async def test_a_claim_that_turned_nobody_away_wakes_nobody(stack: Stack) -> None:
    a, _b, _ledger, patches = stack
    assert a.filter({"Pod": shared_slice("y", 12), "NodeNames": ["s4k"]})["NodeNames"] == ["s4k"]
    assert await until(lambda: not a._claims)  # lapsed unused, but nobody waits for it
    assert not await until(lambda: bool(patches.patched), seconds=1.0), patches.patched


async def test_a_wake_for_a_node_the_mirror_does_not_hold_patches_nothing(stack: Stack) -> None:
    _a, _b, ledger, patches = stack
    await ledger.notify("wake", "ghost")  # a notice for any name must not make the watchers patch arbitrary nodes
    await ledger.notify("wake", "s4k")
    assert await until(lambda: patches.patched == ["s4k"]), patches.patched


async def test_a_claim_dropped_by_a_bind_to_another_node_wakes_the_pod_it_turned_away(stack: Stack) -> None:
    """Red team: y's claim on a is on s4k; y's bind that reaches a is for another node (y was refused on s4k
    and filtered again on b): nothing was booked on s4k, so the claim ends unused there."""
    a, b, ledger, patches = stack
    await ledger.upsert_node(node_inventory(node("n2", 96, 1), CFG))
    assert await until(lambda: all(e.mirror.get("n2") is not None for e in (a, b)))
    y, x = shared_slice("y", 12), shared_slice("x", 8)
    assert a.filter({"Pod": y, "NodeNames": ["s4k"]})["NodeNames"] == ["s4k"]
    assert a.filter({"Pod": x, "NodeNames": ["s4k"]})["NodeNames"] == []
    assert (await ledger.reserve("s4k", "z", [0], 16, 8, 1, pod="ns/p-z"))[0].ok
    assert await until(lambda: "z" in b.mirror.nodes["s4k"].reservations)
    assert b.filter({"Pod": y, "NodeNames": ["s4k", "n2"]})["NodeNames"] == ["n2"]  # 8 cores left on s4k
    assert (await a.bind({"PodName": "p-y", "PodNamespace": "ns", "PodUID": "y", "Node": "n2"}))["Error"] == ""
    await a.settled()
    assert await until(lambda: patches.patched == ["s4k"]), (patches.patched, a._turned_away)
    assert a.filter({"Pod": x, "NodeNames": ["s4k"]})["NodeNames"] == ["s4k"]


async def test_a_node_leaves_the_turned_away_set_once_nothing_is_held_there(
        stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    """Red team: a node recorded while only a bind in flight held it (and a name the mirror lacks) is
    dropped from the turned-away set when that hold ends: no stale entry, no leak of gone nodes' names."""
    a, _b, _ledger, _patches = stack
    gate = asyncio.Event()
    real = extender_module.place

    async def slow_place(*args: Any, **kw: Any) -> Any:
        await gate.wait()
        return await real(*args, **kw)

    monkeypatch.setattr(extender_module, "place", slow_place)
    x = shared_slice("x", 8)
    for name in ("s4k", "ghost"):
        uid = f"y{name}"
        a.kube.pods[("ns", f"p-{uid}")] = shared_slice(uid, 12)  # type: ignore[union-attr]
        gate.clear()
        task = asyncio.create_task(a.bind({"PodName": f"p-{uid}", "PodNamespace": "ns", "PodUID": uid,
                                           "Node": name}))
        assert await until(lambda name=name: name in a.held)  # type: ignore[misc]
        assert a.filter({"Pod": x, "NodeNames": [name]})["NodeNames"] == []
        gate.set()
        await task
    await a.settled()
    assert a.held == {} and a._turned_away == set(), (a.held, a._turned_away)
