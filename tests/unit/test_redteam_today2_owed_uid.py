"""Red team, today's changes: a node problem's event held back by the one-a-minute limit is owed, and sent when the
minute ends with the uid of the Node it was held back for. A Node deleted and created again under the same name while
the watch was down (a re-list: no DELETED event) has another uid: the owed event named the old one, an object that
no longer exists (`kubectl describe node` shows events by the Node's uid: none), and the new Node, with the same
problem, got no event at all (its problem looked unchanged). A Node of another uid is a new node: its problem is
reported for it."""

from __future__ import annotations

import asyncio

import pytest

import controller.mismatch as mismatch
from controller.mismatch import UNHEALTHY_REASON, MismatchReporter
from shared.domain.node import node_inventory
from tests._wait import eventually
from tests.unit._servers import PostingKube
from tests.unit.test_nodes_unhealthy import C96, sick


async def test_a_node_created_again_under_its_name_gets_the_event_under_its_own_uid(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mismatch, "EVENT_EVERY_SECONDS", 0.3)
    api = PostingKube()
    r = MismatchReporter(api, C96)  # type: ignore[arg-type]
    r.observe("gpu-1", sick("gpu-1"), node_inventory(sick("gpu-1"), C96))
    worse = sick("gpu-1", cards=2, sick_cards=2)
    r.observe("gpu-1", worse, node_inventory(worse, C96))  # within the minute: owed, for uid-gpu-1
    await asyncio.gather(*r._tasks)
    assert len(api.posted) == 1
    # deleted and created again while the watch was down: the re-list has the same name, another uid, that problem
    again = sick("gpu-1", cards=2, sick_cards=2)
    again["metadata"]["uid"] = "uid-gpu-1-again"
    r.observe("gpu-1", again, node_inventory(again, C96))
    r.synced({"gpu-1"})
    await eventually(lambda: len(api.posted) >= 2, within=5, what="an event for the node created again")
    await asyncio.gather(*r._tasks)
    assert [e["involvedObject"]["uid"] for e in api.posted[1:]] == ["uid-gpu-1-again"], api.posted
    assert api.posted[1]["reason"] == UNHEALTHY_REASON
    r.observe("gpu-1", None, None)  # deleted: nothing of it kept
    assert r.uids == {} and r._owed == {} and r._event_at == {}
