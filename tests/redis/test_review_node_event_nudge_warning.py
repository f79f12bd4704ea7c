"""Review of the node watcher's coalescing: its warning about a node that changes faster than it is handled.

Our own nudger writes a Node (the annotation mtsched.io/capacity-freed, controller/nudger.py) half a second after the
node watcher handled a change that offers more room (a card healthy again, a node back): that write comes back as the
node's next event within the node's interval, is held back once, and the warning `node X changes faster than the
node watcher handles a node` named the node, routinely, sending whoever reads it after a writer that is mtsched. A
node changed once within its interval is not one that changes faster than it is handled: the warning names nodes
with two changes or more held back (a Node changed in a tight loop: at once).

Counted, never timed: the test's clock stands still but for its ticks.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from controller.nudger import FREED_ANNOTATION
from tests._wait import eventually
from tests.redis.test_redteam_node_event_flood import Rig, hot, rig, stream  # noqa: F401 (the fixture)
from tests.redis.test_redteam_node_health import gpu_node

pytestmark = pytest.mark.redis
WARNING = "changes faster than the node watcher handles a node"


def nudged(node: dict[str, Any]) -> dict[str, Any]:
    node.setdefault("metadata", {}).setdefault("annotations", {})[FREED_ANNOTATION] = "1765100000000"
    return node


async def test_our_own_nudge_after_a_change_is_no_flapping_node(
        rig: Rig, caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811
    nodes = rig.nodes
    asked: list[str] = []
    nodes.nudge = asked.append
    caplog.set_level(logging.WARNING, "mtsched.watchers")
    await stream(nodes, "MODIFIED", gpu_node("calm", cards=9))  # one more card: room, so the nudger is asked
    await eventually(lambda: nodes.handled == 1, what="calm handled")
    assert asked == ["calm"]
    rig.tick(0.5)
    await stream(nodes, "MODIFIED", nudged(gpu_node("calm", cards=9)))  # the nudge's write, back as an event
    assert len(nodes.events) == 1, "held back until its interval is over"
    assert WARNING not in caplog.text, caplog.text
    rig.tick(0.5)
    await eventually(lambda: nodes.handled == 2, what="the nudge's event handled")
    # a node changed in a tight loop is named at once
    await stream(nodes, "MODIFIED", hot(0))
    await eventually(lambda: nodes.handled == 3, what="hot handled")
    for i in range(1, 4):
        await stream(nodes, "MODIFIED", hot(i))
    assert "node hot " + WARNING in caplog.text, caplog.text
