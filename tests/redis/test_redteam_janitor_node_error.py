"""Red team: one node whose reads fail (its Redis Cluster shard down) stops the janitor's expiry on every node.

A sweep looks at its nodes one by one (the mirror's order), then reads the pods of all of them at once and sends each
node's expiry once its own pods are answered. An error while looking at one node (its fresh snapshot, or the watcher's
confirmation, failing: a shard of a Redis Cluster out of reach, for minutes) raised at once and closed the vetting of
the nodes looked at before it, and the nodes after it were never looked at: each sweep ended so, and no pending
booking past its TTL was expired anywhere while that one shard was down (node by node, the nodes before it were
still expired). The vetting of the nodes' reads runs each to its end whatever another's error (`_together`); the
look did not.

Expected: the nodes whose own reads work are expired; the error is raised once the sweep is done (the supervisor
counts it and restarts the loop).

Real parts: redis-server, Ledger, Mirror, PodWatcher, the role's janitor; the API server is the test's (404: gone).
"""

from __future__ import annotations

from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from controller.pod_watch import PodWatcher
from shared.kube import KubeError
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis.test_janitor_concurrent_reads import due_bookings
from tests.redis.test_redteam_janitor_lagging_view import live

pytestmark = pytest.mark.redis


async def test_redteam_a_node_that_cannot_be_read_stops_no_other_nodes_expiry(
        watched: tuple[Ledger, Mirror, PodWatcher], monkeypatch: pytest.MonkeyPatch) -> None:
    led, mirror, w = watched
    live(w)
    nodes = {"e0": 1, "e1": 1, "e2": 1}
    janitor, _ = await due_bookings(led, mirror, w, nodes)
    assert [n for n in mirror.nodes if n in nodes] == ["e0", "e1", "e2"]

    async def get_pod(namespace: str, name: str) -> dict[str, Any]:
        raise KubeError(404, {"message": f"pods \"{name}\" not found"}, f"GET pod {namespace}/{name}")

    w.kube.get_pod = get_pod  # type: ignore[method-assign]
    snapshot = led.snapshot

    async def shard_down(node: str, *args: Any, **kw: Any) -> Any:
        if node == "e1":
            raise RedisConnectionError("Error 111 connecting to redis-2:6379. Connection refused.")
        return await snapshot(node, *args, **kw)

    monkeypatch.setattr(led, "snapshot", shard_down)
    with pytest.raises(RedisConnectionError):
        await janitor.sweep()
    monkeypatch.setattr(led, "snapshot", snapshot)
    left = {n: sorted((await led.snapshot(n)).reservations) for n in nodes}  # type: ignore[union-attr]
    assert left == {"e0": [], "e1": ["u-e1-0"], "e2": []}, (
        f"left pending past the TTL: {left}; one node whose reads fail stopped the expiry of every other node")
