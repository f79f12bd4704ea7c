"""Red team on commit d820291: a release looks at the pod's spec.nodeName first (Mirror.owner_of hint).

Attack: a nodeName that is not where the ledger holds the pod (a node renamed, a pod created with a
hostile nodeName naming a node where another pod holds cards). The hint is only taken where the ledger
holds this very pod uid, so the release frees the pod's own booking and nothing of anyone else's.

Real parts: redis-server, the product's Ledger, Mirror and PodWatcher; the API client only takes the
watcher's node nudge."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from controller.pod_watch import PodWatcher
from shared.config import load_config
from shared.store.ledger import Ledger
from tests.redis.conftest import MirrorFactory
from tests.redis.helpers import S4000, inventory

pytestmark = pytest.mark.redis
CFG = load_config(env={}, flags={"memoryPerCard": "96,160"})


class Nudges:
    """The watchers' API client: it takes the node nudges a release sends, nothing else."""

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        assert method == "PATCH" and path.startswith("/api/v1/nodes/"), (method, path)
        return {}


def ended(uid: str, node_name: str) -> dict[str, Any]:
    return {"metadata": {"name": uid, "namespace": "ns", "uid": uid}, "spec": {"nodeName": node_name},
            "status": {"phase": "Succeeded"}}


async def holders(ledger: Ledger) -> dict[str, list[str]]:
    snaps = await ledger.snapshots(["a", "b"])
    return {n: sorted(s.reservations) for n, s in snaps.items()}


async def test_a_misleading_node_name_releases_the_pods_own_booking_only(ledger: Ledger,
                                                                        mirror_factory: MirrorFactory) -> None:
    for n in ("a", "b"):
        await ledger.upsert_node(inventory(n, S4000))
    assert (await ledger.reserve("a", "mine", [0], 8, 2, 1, pod="ns/mine"))[0].ok
    assert (await ledger.reserve("b", "other", [0], 8, 2, 1, pod="ns/other"))[0].ok
    # one uid held twice: a stale pending booking on a, the bound one on b (where the pod runs)
    assert (await ledger.reserve("a", "twice", [1], 8, 2, 1, pod="ns/twice"))[0].ok
    assert (await ledger.reserve("b", "twice", [1], 8, 2, 1, pod="ns/twice"))[0].ok
    assert await ledger.mark_bound("b", "twice")
    mirror = await mirror_factory()
    pods = PodWatcher(Nudges(), ledger, mirror, CFG, asyncio.Event())  # type: ignore[arg-type]
    pods.nudger.interval = 0.0
    await pods.release("mine", ended("mine", "b"), "succeeded")  # b holds cards, not this pod's
    assert await holders(ledger) == {"a": ["twice"], "b": ["other", "twice"]}
    await pods.release("ghost", ended("ghost", "b"), "succeeded")  # a uid held nowhere
    assert await holders(ledger) == {"a": ["twice"], "b": ["other", "twice"]}
    # the node the pod runs on goes first: its bound booking; the stale one ends by its TTL (janitor)
    await pods.release("twice", ended("twice", "b"), "succeeded")
    assert await holders(ledger) == {"a": ["twice"], "b": ["other"]}
