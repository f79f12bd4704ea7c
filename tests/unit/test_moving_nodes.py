"""A node whose Redis Cluster slot is being moved between shards (Mirror.moving: the mirror could not read it, so
its snapshot may be stale) is offered by no filter, with every k, while every other node is (controller/fit_memo.py
MOVING); once it can be read again it is offered as before."""

from __future__ import annotations

import dataclasses

import pytest

from controller.extender import Extender
from controller.fit_memo import MOVING
from shared.domain.state import CardRecord, NodeSnapshot
from tests.unit._servers import CFG, extender, pod


def free(index: int) -> CardRecord:
    return CardRecord(index, 96, 0, 96, 16, 0, 16, 0, 16, "ok")


def cluster(k: int) -> Extender:
    ext = extender(dataclasses.replace(CFG, filter_top_k=k))
    ext.mirror.replace_all({})
    for name in ("a", "b", "c"):
        ext.mirror.put(NodeSnapshot(name, 1, cards={0: free(0), 1: free(1)}))
    return ext


@pytest.mark.parametrize("k", [0, 1, 2, 5])
def test_a_moving_node_is_not_offered_and_others_are(k: int) -> None:
    ext = cluster(k)
    names = ["a", "b", "c"]
    assert "b" in ext.filter({"Pod": pod("u0"), "NodeNames": names})["NodeNames"] or k == 1
    ext.mirror.moving = frozenset({"b"})
    got = ext.filter({"Pod": pod("u1"), "NodeNames": names})
    assert "b" not in got["NodeNames"] and got["NodeNames"]  # the others still are
    assert not got["Error"]
    ext.mirror.moving = frozenset()
    assert ext.filter({"Pod": pod("u2"), "NodeNames": ["b"]})["NodeNames"] == ["b"]


@pytest.mark.parametrize("k", [0, 1])
def test_only_moving_nodes_fit_nowhere_and_say_why(k: int) -> None:
    ext = cluster(k)
    ext.mirror.moving = frozenset({"a", "b"})
    got = ext.filter({"Pod": pod("u1"), "NodeNames": ["a", "b"]})
    assert got["NodeNames"] == []
    assert got["FailedAndUnresolvableNodes"] == {"a": MOVING, "b": MOVING}
