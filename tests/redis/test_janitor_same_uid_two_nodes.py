"""The same pod's bookings on two nodes, both past the TTL (its first binder died before its Binding on `sa`, the
second after its Binding on `sb`, the pod view lagging), vetted by one sweep whose reads overlap: the one on the node
the API server has the pod bound on is kept, the other expired, whichever read is answered first."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from controller.pod_watch import PodWatcher
from controller.watchers import janitor_for
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis.helpers import S4000, eventually, inventory
from tests.redis.test_redteam_janitor_lagging_view import live
from tests.redis.test_watcher_records import CFG

pytestmark = pytest.mark.redis


@pytest.mark.parametrize("first", ["sa", "sb"])
async def test_one_pods_bookings_on_two_nodes_judged_each_on_its_own_node(
        watched: tuple[Ledger, Mirror, PodWatcher], first: str) -> None:
    led, mirror, w = watched
    live(w)
    for node in ("sa", "sb"):
        await led.upsert_node(inventory(node, S4000, 1))
        assert (await led.reserve(node, "u", [0], 8, 2, 1, pod="ns/p"))[0].ok
    await eventually(lambda: all(n in mirror.nodes and "u" in mirror.nodes[n].reservations for n in ("sa", "sb")),
                     what="the mirror shows both bookings")
    janitor = janitor_for(led, mirror, CFG, w)
    janitor.ttl = 1
    made = await led.redis_time_ms()

    async def past_ttl() -> bool:
        return await led.redis_time_ms() - made > 1000

    await eventually(past_ttl, what="the bookings past their TTL")
    turn = {"sa": asyncio.Event(), "sb": asyncio.Event()}
    turn[first].set()
    calls = 0

    async def get_pod(namespace: str, name: str) -> dict[str, Any]:
        nonlocal calls
        calls += 1
        mine = "sa" if calls == 1 else "sb"  # (the order the janitor asks in does not matter: the answer is one pod)
        await turn[mine].wait()
        for t in turn.values():
            t.set()
        return {"metadata": {"uid": "u", "namespace": namespace, "name": name}, "spec": {"nodeName": "sb"},
                "status": {"phase": "Running"}}

    w.kube.get_pod = get_pod  # type: ignore[method-assign]
    assert await janitor.sweep() == ["u"]
    a, b = await led.snapshot("sa"), await led.snapshot("sb")
    assert a is not None and b is not None
    assert "u" not in a.reservations and "u" in b.reservations
