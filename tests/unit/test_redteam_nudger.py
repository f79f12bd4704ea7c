"""Red team: the Nudger under churn on one node.

A release every little more than `interval` (a node whose pods come and go: a job's workers, a preemption
wave) starts a new task per release, each waiting `interval + follow_up`; an older task's follow-up is
skipped only when a newer nudge happens to be *pending* at the very moment it is due, so between the
pending windows every release costs two patches and `follow_up / interval` tasks per node sleep at once
(10 per node with the defaults; 50,000 sleeping tasks for 5,000 churning nodes). A newer first patch already
covers what an older follow-up was for (it is later, and it has a follow-up of its own), so the older one
must go: at most one task waits for a follow-up per node, and a burst ends with one follow-up."""

from __future__ import annotations

import asyncio
from typing import Any

from controller.nudger import Nudger
from tests._wait import eventually


class Patches:
    def __init__(self) -> None:
        self.sent: list[str] = []

    async def request(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        self.sent.append(path.rsplit("/", 1)[1])
        return {}


async def test_redteam_churn_on_one_node_keeps_one_follow_up_and_few_tasks() -> None:
    kube = Patches()
    n = Nudger(kube, interval=0.01, follow_up=2.0)  # type: ignore[arg-type]
    nudges, most = 20, 0
    for i in range(nudges):  # each release once the one before has had its first patch (> interval apart)
        n.nudge("a")
        await eventually(lambda i=i: len(kube.sent) > i, within=30, what=f"release {i}'s first patch")
        for _ in range(20):  # loop turns (not time) for a superseded task to end
            await asyncio.sleep(0)
        most = max(most, len(n._tasks))
    while n._tasks:
        await asyncio.gather(*list(n._tasks))
    firsts = kube.sent.count("a")
    assert most <= 2, f"{most} tasks alive at once for one node"
    assert firsts <= nudges + 1, f"{firsts} patches for {nudges} releases"


async def test_redteam_a_follow_up_still_follows_the_last_release() -> None:
    kube = Patches()
    n = Nudger(kube, interval=0.01, follow_up=1.0)  # type: ignore[arg-type]
    n.nudge("a")
    await eventually(lambda: kube.sent == ["a"], within=30, what="the first patch")  # its follow-up waits 1 s
    n.nudge("a")  # a newer release: its own pair; the older follow-up is not needed
    while n._tasks:
        await asyncio.gather(*list(n._tasks))
    assert kube.sent == ["a", "a", "a"]  # first, newer first, newer follow-up
