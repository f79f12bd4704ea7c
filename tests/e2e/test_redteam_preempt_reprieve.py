"""Red team of the preempt verb on the real control plane: a reduced answer does not let the preemptor in.

kube-scheduler's dry run keeps a lower-priority pod out only when putting it back makes the preemptor fail
its own filters, so each of its victims is needed for something it counts. Here card 1 holds two low pods:
`c` (32 units and most of the node's cpu) and `d` (64 units). The preemptor asks 64 units and 4 cpus:
kube-scheduler proposes both (c for the cpu, d for the memory); the verb kept only d (the former
"reduced": d alone
frees 64 units of card 1). After d goes the preemptor still fails NodeResourcesFit (Insufficient cpu) on its
nominated node, and a second round evicts c: two rounds of graceful deletions where one was due, and the
first victims go for nothing if the second round picks another node.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from deploy.local.stack import Stack
from shared.domain.fit import USE_UUID
from tests.e2e.test_preempt import (  # noqa: F401 (fixtures)
    DEADLINE,
    _nominated,
    _terminating,
    pods,
    preempt_outcomes,
    priorities,
    stack,
    terminating,
    until,
)
from tests.e2e.test_product import CORE, MEM, VGPU, Cluster

pytestmark = pytest.mark.e2e


async def make(cluster: Cluster, name: str, memory: int, cpu: int, priority: str, card: str | None) -> None:
    p = cluster.pod(name, {VGPU: 1, MEM: memory, CORE: 4, "cpu": cpu},
                    annotations={USE_UUID: card} if card else None)
    p["spec"]["priorityClassName"] = priority
    await cluster.create(p)


async def test_the_answered_victims_let_the_preemptor_bind(
        cluster: Cluster, stack: Stack, priorities: dict[str, str]) -> None:  # noqa: F811
    node = await cluster.add_node(96, cards=2)
    card = [f"{node}-mthreads-{i}" for i in range(2)]
    await make(cluster, "top", 96, 1, priorities["top"], card[0])  # card 0: above the preemptor
    await make(cluster, "c", 32, 60, priorities["low"], card[1])  # card 1: little memory, most of the cpu
    await make(cluster, "d", 64, 1, priorities["lowest"], card[1])
    await cluster.wait_bound("top", "c", "d")
    before = preempt_outcomes(stack)

    await make(cluster, "urgent", 64, 4, priorities["high"], None)
    # both at once (kube-scheduler deletes victims one call each: a poll may fall between the two deletions, so
    # stopping at the first one seen took the second for a second round)
    first: set[str] = await until("the first round's two victims (c and d) terminating",
                                  lambda: _terminating(cluster, 2))
    await until("nominated node", lambda: _nominated(cluster, "urgent"))
    after = preempt_outcomes(stack)
    for v in first:  # the kubelet's part
        await cluster.delete(v)

    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        listed = await pods(cluster)
        if listed["urgent"]["spec"].get("nodeName"):
            break
        more = terminating(listed) - first
        if more:
            events = [e for e in await cluster.events("urgent") if "FailedScheduling" in e or "Preempt" in e]
            outcomes = {k: after.get(k, 0) - before.get(k, 0) for k in after}
            pytest.fail(f"the preempt verb answered {sorted(first)} (outcomes {outcomes}); after they went, "
                        f"urgent still did not fit and a second round evicted {sorted(more)}; urgent's events: "
                        f"{events}")
        await asyncio.sleep(0.2)
    else:
        pytest.fail("urgent neither bound nor preempted again")
    assert first == {"c", "d"}
