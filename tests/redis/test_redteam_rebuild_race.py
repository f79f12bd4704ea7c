"""Red team: a rebuild racing the node watcher leaves the ledger on a stale Node list past every reconcile pass.

A rebuild (`Reconciler.rebuild`: Redis flushed or restarted empty, a known node missing) lists Nodes and Pods,
writes every node with `replace_node`, removes from the ledger every listed node the Node list lacked, and
then overwrites the node watcher's view with that list (`self.nodes.last = by_name`, `self.nodes.known = ...`).
The node watcher keeps handling events meanwhile (it is another supervised task of the same role). So any
Node change that lands while the rebuild runs, which at 5,000 nodes takes seconds, is undone:

* a card cordoned (`hami.io/device-cordon`) or a node's slice limit lowered (`mtsched.io/max-inst`) is
  written by the watcher, then overwritten by the rebuild's older copy, or written after it and then
  *repaired back* to the older copy by the next reconcile pass (which compares with `nodes.last`, now the
  rebuild's list);
* a node that joins during the rebuild is written by the watcher (`replace_node`) and then removed by the
  rebuild (it is in `mt:nodes` but not in the rebuild's list); it is in neither `nodes.last` nor `nodes.known`
  afterwards, so no reconcile pass ever looks at it.

Nothing heals it but the next write of that Node (the watcher compares it with `last`, now the rebuild's
copy) or a watch re-list: no reconcile pass does. With the kubelet's node lease an unchanged Node is written
only every nodeStatusReportFrequency (5 minutes by default). Meanwhile the ledger offers a cordoned card, books
more slices on a card than its `max_inst` allows (the vendor module refuses them: containers fail to start),
or offers nothing on a node that is there. Documented bound: reconcileSeconds + 10 s + one pass.

Real parts: redis-server, the product's Ledger, Mirror, NodeWatcher, PodWatcher and Reconciler; the API
client answers the lists (and takes the nudges), and delivers the Node event at the interleaving named.
Fix: controller/reconciler.py `rebuild` (do not replace the node watcher's view with the rebuild's list, or
re-apply the watcher's newer copies after it / run the rebuild under a lock the node watcher's `apply` takes,
and never remove a node the watcher wrote after the list began).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis

from controller.node_watch import NodeWatcher
from controller.pod_watch import PodWatcher
from controller.reconciler import Reconciler
from controller.watchers import wire
from shared.config import load_config
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis.test_redteam_inflight_nodes import gpu_node

pytestmark = pytest.mark.redis
CFG = load_config(env={}, flags={"memoryPerCard": "96,160", "reconcileSeconds": "300"})


def annotated(name: str, annotations: dict[str, str]) -> dict[str, Any]:
    n = gpu_node(name)
    n["metadata"]["annotations"] = annotations
    return n


class Api:
    """Answers the rebuild's lists with `nodes` (taken when the list is made); `during_pods` runs while the pod
    list is in flight (after the Node list was taken): the node watcher handles an event then."""

    def __init__(self, nodes: list[dict[str, Any]]):
        self.nodes = nodes
        self.during_pods: Callable[[], Awaitable[None]] | None = None

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        if method == "PATCH":  # the nudger
            return {}
        assert method == "GET", (method, path)
        if path == "/api/v1/nodes":
            return {"items": [dict(n) for n in self.nodes], "metadata": {"resourceVersion": "7"}}
        if self.during_pods is not None:
            hook, self.during_pods = self.during_pods, None
            await hook()
        return {"items": [], "metadata": {"resourceVersion": "7"}}

    async def get_pod(self, ns: str, name: str) -> Any:
        raise AssertionError(f"unexpected GET pod {ns}/{name}")

    async def create_event(self, *_: Any, **__: Any) -> None:
        return None


async def role(ledger: Ledger, api: Api) -> tuple[NodeWatcher, PodWatcher, Reconciler]:
    nodes = NodeWatcher(api, ledger, CFG)  # type: ignore[arg-type]
    pods = PodWatcher(api, ledger, Mirror(ledger), CFG, nodes.lost)  # type: ignore[arg-type]
    wire(nodes, pods)
    rec = Reconciler(api, ledger, CFG, nodes, pods)  # type: ignore[arg-type]
    pods.nudger.nudge = lambda node: None  # type: ignore[method-assign]
    return nodes, pods, rec


def watcher_events(nodes: NodeWatcher) -> tuple[Callable[[str, dict[str, Any]], Awaitable[None]],
                                                   list[asyncio.Task[None]]]:
    """The node watcher's events, each handled in a task of its own as the role's reflector does (not inside
    the rebuild's await), started before the caller goes on."""
    tasks: list[asyncio.Task[None]] = []

    async def event(kind: str, obj: dict[str, Any]) -> None:
        tasks.append(asyncio.create_task(nodes.on_event(kind, obj)))
        await asyncio.sleep(0)  # the handler starts (and runs, or waits its turn)

    return event, tasks


async def settle(tasks: list[asyncio.Task[None]]) -> None:
    assert tasks, "the node event was delivered during the rebuild"
    await asyncio.wait_for(asyncio.gather(*tasks), 10)


def event_after_rewrite(ledger: Ledger, event: Callable[[str, dict[str, Any]], Awaitable[None]],
                        after: dict[str, Any]) -> None:
    """The node watcher's MODIFIED event of n (`after`) comes right after a rebuild rewrote n in Redis."""
    real = ledger.replace_node

    async def replace_then_event(inv: Any, *a: Any, **kw: Any) -> Any:
        out = await real(inv, *a, **kw)
        if inv.node == "n":
            await event("MODIFIED", after)
        return out

    ledger.replace_node = replace_then_event  # type: ignore[method-assign]


async def started(ledger: Ledger) -> tuple[Api, NodeWatcher, Reconciler,
                                          Callable[[str, dict[str, Any]], Awaitable[None]], list[asyncio.Task[None]]]:
    """The role on node n (a GPU node, as the API lists it), after its first rebuild."""
    api = Api([gpu_node("n")])
    nodes, _pods, rec = await role(ledger, api)
    event, events = watcher_events(nodes)
    await rec.rebuild("start")
    return api, nodes, rec, event, events


async def age_fence(redis: Redis, ledger: Ledger, node: str, ms: int) -> None:
    """Make the node's first comparison under this Redis's history `ms` older, as if the keep window passed."""
    key = ledger.keys.node(node)
    since = await redis.hget(key, "unverified_since")  # type: ignore[misc]
    assert since, f"node {node} is not waiting to be verified"
    token, at = str(since).rsplit(":", 1)
    await redis.hset(key, "unverified_since", f"{token}:{int(at) - ms}")  # type: ignore[misc]


async def card(ledger: Ledger, node: str, idx: int) -> tuple[str, int] | None:
    snap = await ledger.snapshot(node)
    if snap is None or idx not in snap.cards:
        return None
    c = snap.cards[idx]
    return c.health, c.slice_limit


@pytest.mark.parametrize("when", ["during the pod list", "after the rebuild rewrote the node"])
async def test_redteam_a_slice_limit_lowered_during_a_rebuild_stays_lowered(ledger: Ledger, redis_client: Redis,
                                                                            when: str) -> None:
    after = annotated("n", {"mtsched.io/max-inst": "2"})
    api, nodes, rec, event, events = await started(ledger)
    assert await card(ledger, "n", 0) == ("ok", 16)

    if when == "during the pod list":
        # a rebuild for another reason than a flush ("node missing": another replica forgot a node), so the
        # watcher's write of n lands (a flushed n would answer -1 and ask for one more rebuild)
        api.during_pods = lambda: event("MODIFIED", after)
    else:
        await redis_client.flushall()  # Redis restarted empty: the reconciler's next check rebuilds
        assert not await ledger.intact()
        event_after_rewrite(ledger, event, after)
    await rec.rebuild("node missing" if when == "during the pod list" else "state lost")
    ledger.replace_node = Ledger.replace_node.__get__(ledger)  # type: ignore[method-assign]
    await settle(events)
    assert not nodes.lost.is_set() and await ledger.intact()  # nothing asks for another rebuild
    api.nodes = [after]  # the API's truth from now on
    await rec.reconcile_all()  # the pass the rebuild asks for, and a periodic one: the fault is over
    if when != "during the pod list":
        # after the flush the node books nothing for the keep window (a bind in flight then may hold a card
        # the flush forgot, docs/redis-layout.md "Losing Redis"): let it pass
        await age_fence(redis_client, ledger, "n", rec.keep_ms)
    await rec.reconcile_all()

    assert await card(ledger, "n", 0) == ("ok", 2), (
        f"max-inst 2 was set on the Node {when}; after the rebuild and two reconcile passes the "
        f"ledger still lets card 0 take {await card(ledger, 'n', 0)} slices")
    booked = [(await ledger.reserve("n", f"s{i}", [0], 2, 1, 1, pod=f"ns/s{i}"))[0].ok for i in range(3)]
    assert booked == [True, True, False], f"3 slices booked on a card whose max_inst is 2: {booked}"


async def test_redteam_a_card_cordoned_during_a_rebuild_stays_cordoned(ledger: Ledger, redis_client: Redis) -> None:
    after = annotated("n", {"hami.io/device-cordon": "n-mthreads-0"})
    api, nodes, rec, event, events = await started(ledger)
    await redis_client.flushall()
    event_after_rewrite(ledger, event, after)
    await rec.rebuild("state lost")
    ledger.replace_node = Ledger.replace_node.__get__(ledger)  # type: ignore[method-assign]
    await settle(events)
    assert not nodes.lost.is_set() and await ledger.intact()  # nothing asks for another rebuild
    assert await card(ledger, "n", 0) == ("cordoned", 16)  # the watcher's write is there after the rebuild ...
    api.nodes = [after]
    await rec.reconcile_all()
    # ... and the reconciler "repairs" it back to the rebuild's older list
    assert await card(ledger, "n", 0) == ("cordoned", 16), (
        f"card 0 was cordoned on the Node during the rebuild; after a reconcile pass the ledger offers it: "
        f"{await card(ledger, 'n', 0)}")


async def test_redteam_a_node_that_joins_during_a_rebuild_is_not_removed(ledger: Ledger, redis_client: Redis) -> None:
    api = Api([gpu_node("old")])
    nodes, _pods, rec = await role(ledger, api)
    event, events = watcher_events(nodes)
    await rec.rebuild("start")
    await redis_client.flushall()
    joined = gpu_node("joined")
    api.during_pods = lambda: event("ADDED", joined)  # the node joins while the rebuild lists pods
    await rec.rebuild("state lost")
    await settle(events)
    assert not nodes.lost.is_set() and await ledger.intact()  # nothing asks for another rebuild
    api.nodes = [gpu_node("old"), joined]
    await rec.reconcile_all()
    await rec.reconcile_all()
    assert "joined" in await ledger.nodes() and await card(ledger, "joined", 0) == ("ok", 16), (
        f"node 'joined' joined during the rebuild: the ledger knows {await ledger.nodes()}; its card 0: "
        f"{await card(ledger, 'joined', 0)} (every bind there fails 'node unregistered' until the Node is "
        "written again or re-listed)")
