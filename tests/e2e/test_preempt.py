"""Card-aware preemption on the real control plane: kube-scheduler's own preemption, with our extender's
preempt verb (controller/preempt.py) deciding which of its victims free a card.

What really happens: a higher-priority pod fails kube-scheduler's node totals (sgpu-memory) on a full node;
DefaultPreemption dry-runs the node without lower-priority pods, reprieves the most important ones again
while the totals still fit, and calls our preempt verb with the rest. We answer with the victims that free
one card (or none: the node is dropped, nothing is evicted). kube-scheduler then sets the preemptor's
nominatedNodeName, marks each victim DisruptionTarget and deletes it (graceful: the pod is Terminating and
its card stays booked, the container still runs). The harness has no kubelet, so the test does the
kubelet's part: it removes the Terminating victims (grace 0). The watchers release their shares, nudge
kube-scheduler, and the preemptor binds through the extender's normal filter and bind.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
import pytest_asyncio

from deploy.local.controlplane import ControlPlane
from deploy.local.redis import RedisServer
from deploy.local.stack import Stack
from shared.domain.fit import USE_UUID
from tests.e2e._wait import until_true
from tests.e2e.test_product import CORE, MEM, VGPU, Cluster, grants

pytestmark = pytest.mark.e2e

DEADLINE = 60.0


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane, redis_server: RedisServer) -> Iterator[Stack]:
    with Stack(control_plane, redis_server.empty().url, "96").running() as st:
        yield st


@pytest_asyncio.fixture
async def priorities(cluster: Cluster) -> AsyncIterator[dict[str, str]]:
    """PriorityClasses (cluster-scoped, so named per test): lowest < low < high (the preemptor) < top."""
    made = {}
    for name, value in (("lowest", 10), ("low", 100), ("high", 1000), ("top", 100000)):
        pc = f"e2e-{name}-{uuid.uuid4().hex[:6]}"
        await cluster.kube.request("POST", "/apis/scheduling.k8s.io/v1/priorityclasses",
                                   {"metadata": {"name": pc}, "value": value})
        made[name] = pc
    yield made
    for pc in made.values():
        await cluster.kube.request("DELETE", f"/apis/scheduling.k8s.io/v1/priorityclasses/{pc}", ok=(200, 404))


async def until(what: str, check: Callable[[], Awaitable[Any]], timeout: float = DEADLINE) -> Any:
    """`check()`'s first truthy answer (tests/e2e/_wait.py until_true), within the preemption tests' deadline."""
    return await until_true(check, what, timeout=timeout)


async def slice_pod(cluster: Cluster, name: str, memory: int, priority: str, card: str | None = None) -> None:
    p = cluster.pod(name, {VGPU: 1, MEM: memory, CORE: 4}, annotations={USE_UUID: card} if card else None)
    p["spec"]["priorityClassName"] = priority
    created = await cluster.create(p)
    assert created["spec"]["priority"] > 0  # the API server's Priority admission resolved the class


async def pods(cluster: Cluster) -> dict[str, dict[str, Any]]:
    listed = await cluster.kube.request("GET", f"/api/v1/namespaces/{cluster.ns}/pods")
    return {p["metadata"]["name"]: p for p in listed["items"]}


def terminating(listed: dict[str, dict[str, Any]]) -> set[str]:
    return {n for n, p in listed.items() if p["metadata"].get("deletionTimestamp")}


def preempt_outcomes(stack: Stack) -> dict[str, float]:
    out = {}
    for line in stack.metrics(stack.role("extender")).splitlines():
        if line.startswith("mtsched_preempt_nodes_total{"):
            labels, value = line.rsplit(" ", 1)
            out[labels.split('outcome="', 1)[1].split('"', 1)[0]] = float(value)
    return out


async def test_preemption_frees_one_card_and_never_touches_the_other(
        cluster: Cluster, stack: Stack, priorities: dict[str, str]) -> None:
    node = await cluster.add_node(96, cards=2)
    card = [f"{node}-mthreads-{i}" for i in range(2)]
    # every card full of low-priority slices: three of 32 units each; card 0's are the least important
    for i in range(3):
        await slice_pod(cluster, f"c0-{i}", 32, priorities["lowest"], card[0])
        await slice_pod(cluster, f"c1-{i}", 32, priorities["low"], card[1])
    await cluster.wait_bound(*(f"c{c}-{i}" for c in range(2) for i in range(3)))
    await cluster.wait_ledger(lambda s: [c.mem_used for c in s[node].cards.values()] == [96, 96])
    before = preempt_outcomes(stack).get("kept", 0)

    await slice_pod(cluster, "urgent", 64, priorities["high"])
    # kube-scheduler evicts what our verb answered: victims marked DisruptionTarget, then deleted (graceful)
    victims: set[str] = await until("two victims terminating", lambda: _terminating(cluster, 2))
    listed = await pods(cluster)
    assert len(victims) == 2 and victims <= {"c0-0", "c0-1", "c0-2"}, victims  # 64 units: two slices of card 0
    assert not terminating(listed) - victims  # card 1 and card 0's third slice untouched
    for v in victims:
        conditions = {c["type"]: c for c in listed[v]["status"].get("conditions", [])}
        assert conditions["DisruptionTarget"]["reason"] == "PreemptionByScheduler"
    urgent = await until("nominated node", lambda: _nominated(cluster, "urgent"))
    assert urgent["status"]["nominatedNodeName"] == node and not urgent["spec"].get("nodeName")
    # Terminating pods still run: their card stays booked, the preemptor waits for it
    snap = (await cluster.snapshots())[node]
    assert [c.mem_used for c in snap.cards.values()] == [96, 96]
    assert preempt_outcomes(stack).get("kept", 0) > before

    async def chosen() -> bool:  # the extender sends it from a background task: it may come after the above
        return any(e.startswith("PreemptionCardChosen") and f"{node}: cards 0 freed, 2 victims" in e
                   for e in await cluster.events("urgent"))

    await until("the PreemptionCardChosen event", chosen)

    for v in victims:  # the kubelet's part: containers stopped, the pods go
        await cluster.delete(v)
    try:
        pod = (await cluster.wait_bound("urgent", timeout=DEADLINE))["urgent"]
    except AssertionError as e:  # what each part held when it timed out, for a failure that is rare
        snap = (await cluster.snapshots()).get(node)
        held = sorted(r.pod for r in snap.reservations.values()) if snap else None
        raise AssertionError(f"{e}\nledger on {node}: {held}\nwatcher: {counters(stack, 'watcher')}\n"
                             f"extender: {counters(stack, 'extender')}\n{stack.logs(40)}") from None
    assert pod["spec"]["nodeName"] == node
    ((g,),) = grants(pod)
    assert g.device_id == card[0] and g.memory_mib == 64 * 512
    await cluster.wait_ledger(lambda s: [c.mem_used for c in s[node].cards.values()] == [96, 96]
                              and {r.pod.split("/")[1] for r in s[node].reservations.values()}
                              == {"urgent", *({"c0-0", "c0-1", "c0-2"} - victims), "c1-0", "c1-1", "c1-2"})
    assert not terminating(await pods(cluster))


async def test_nothing_is_evicted_when_no_card_can_be_freed(
        cluster: Cluster, stack: Stack, priorities: dict[str, str]) -> None:
    node = await cluster.add_node(96, cards=2)
    # each card: 64 units held by a pod above the preemptor, 32 by one below it. Node totals would be freed
    # by evicting both low pods (64 >= 64), but that leaves no card with 64 units: kube-scheduler alone
    # would evict them for nothing.
    for i in range(2):
        await slice_pod(cluster, f"top-{i}", 64, priorities["top"], f"{node}-mthreads-{i}")
        await slice_pod(cluster, f"low-{i}", 32, priorities["lowest"], f"{node}-mthreads-{i}")
    await cluster.wait_bound("top-0", "top-1", "low-0", "low-1")
    before = preempt_outcomes(stack).get("no_card", 0)

    await slice_pod(cluster, "urgent", 64, priorities["high"])

    async def refused() -> list[str]:
        events = await cluster.events("urgent")
        ours = [e for e in events if e.startswith("PreemptionNotHelpful")]
        theirs = [e for e in events if e.startswith("FailedScheduling") and "preemption" in e.lower()]
        return ours + theirs if ours and theirs else []

    events = await until("kube-scheduler's preemption to end without candidates", refused)
    assert any(f"{node}: card 0: CardInsufficientMemory; card 1: CardInsufficientMemory" in e for e in events), events
    assert preempt_outcomes(stack).get("no_card", 0) > before
    listed = await pods(cluster)
    assert not terminating(listed), terminating(listed)
    for name in ("top-0", "top-1", "low-0", "low-1"):
        conditions = {c["type"] for c in listed[name]["status"].get("conditions", [])}
        assert "DisruptionTarget" not in conditions, name
    assert not listed["urgent"]["status"].get("nominatedNodeName") and not listed["urgent"]["spec"].get("nodeName")
    snap = (await cluster.snapshots())[node]
    assert len(snap.reservations) == 4 and [c.mem_used for c in snap.cards.values()] == [96, 96]


async def test_a_preemptor_deleted_while_its_victim_goes_leaves_the_card_at_once(
        cluster: Cluster, stack: Stack, priorities: dict[str, str]) -> None:
    """The verb answered one node; the user deleted the preemptor while its victim terminated. kube-scheduler's own
    filters stop counting it at once; the extender, which read a nominated pod again only when its answer named
    several nodes, kept the card for it until NOMINATION_SECONDS (120 s) passed without a filter of it, and turned
    every pod of a lower priority away from it meanwhile. Now it follows the pod (InFlight.follow) and forgets the
    nomination at the next read that finds it gone (FOLLOW_AT_S: 1, 3, 10 s after the answer, then every 10 s),
    waking the pods turned away there."""
    node = await cluster.add_node(96, cards=1)
    await slice_pod(cluster, "v", 96, priorities["lowest"])
    await cluster.wait_bound("v")
    await slice_pod(cluster, "p1", 64, priorities["high"])
    assert await until("v terminating", lambda: _terminating(cluster, 1)) == {"v"}
    assert (await until("p1 nominated", lambda: _nominated(cluster, "p1")))["status"]["nominatedNodeName"] == node
    await cluster.delete("p1")  # given up on

    async def gone() -> bool:
        return "p1" not in await pods(cluster)

    await until("p1 gone", gone)
    await cluster.delete("v")  # the kubelet's part: the victim's containers stopped
    await cluster.wait_ledger(lambda s: not s[node].reservations)
    await slice_pod(cluster, "q", 64, priorities["low"])
    # before: q turned away for p1 until 120 s after p1's preemption; now within one read of p1 (<= 10 s) and a wake
    pod = (await cluster.wait_bound("q", timeout=DEADLINE))["q"]
    assert pod["spec"]["nodeName"] == node
    await cluster.wait_ledger(lambda s: {r.pod.split("/")[1] for r in s[node].reservations.values()} == {"q"})


def counters(stack: Stack, kind: str) -> list[str]:
    """The role's release, nudge, filter and bind counters (failure reports)."""
    wanted = ("mtsched_releases_total", "mtsched_scheduler_nudges_total", "mtsched_filter_failures_total",
              "mtsched_bindings_total", "mtsched_reconcile_repairs_total")
    return [line for line in stack.metrics(stack.role(kind)).splitlines() if line.startswith(wanted)]


async def _terminating(cluster: Cluster, at_least: int) -> set[str]:
    gone = terminating(await pods(cluster))
    return gone if len(gone) >= at_least else set()


async def _nominated(cluster: Cluster, name: str) -> dict[str, Any] | None:
    pod = await cluster.get(name)
    return pod if pod["status"].get("nominatedNodeName") else None
