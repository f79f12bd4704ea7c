"""A node where a booking was refused `node unverified` (Redis failed over; the watchers have not compared the node
with the API since) is left out of the filter's answer for a keep window while another node fits: kube-scheduler's
next attempt goes to a node that books.

Found by tests/e2e/test_ha_stack.py (a Redis Cluster primary killed with writes lost): the packing policy ranked
the failed-over shard's node first, kube-scheduler sent every pod back to it, and all of them were refused there
(18 refusals) until the node was verified, ~20 s after the kill, while the other shards' nodes had room.
"""

from __future__ import annotations

import dataclasses

import pytest

from controller import extender as extender_module
from shared.store.ledger import UNVERIFIED
from tests.unit._servers import CFG, FakeKube, FakeLedger, bind_args, extender, pod

NODES = {"n0": 96, "n1": 96, "n2": 96}


def fitting(ext: extender_module.Extender, uid: str, names: list[str] | None = None) -> list[str]:
    return list(ext.filter({"Pod": pod(uid), "NodeNames": names or list(NODES)})["NodeNames"])


async def test_a_node_refused_unverified_is_left_out_until_the_keep_window_passed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = FakeLedger()
    ext = extender(kube=FakeKube(), ledger=ledger, nodes=NODES)
    assert fitting(ext, "u0") == list(NODES)
    ledger.refuse = f"{UNVERIFIED}: Redis failed over"
    assert "unverified" in (await ext.bind(bind_args("u0", "n1")))["Error"]
    assert fitting(ext, "u1") == ["n0", "n2"]
    assert fitting(ext, "u2", ["n1"]) == ["n1"]  # alone: still offered (refused at bind, retried as before)
    now = extender_module.time.monotonic()
    monkeypatch.setattr(extender_module.time, "monotonic", lambda: now + extender_module.UNVERIFIED_RANK_SECONDS + 1)
    assert fitting(ext, "u3") == list(NODES)  # the watchers have verified it by now


async def test_another_replicas_verify_notice_leaves_the_node_out() -> None:
    ext = extender(nodes=NODES)
    for cb in ext.mirror.on_notice["verify"]:  # what the mirror calls for a `verify` notice on the feed
        cb("n2")
    assert fitting(ext, "u1") == ["n0", "n1"]
    for n in NODES:  # every node unverified (a Sentinel failover): every one offered, as before
        ext.unverified_seen(n)
    assert fitting(ext, "u2") == list(NODES)


async def test_the_top_k_filter_tries_a_node_refused_unverified_last() -> None:
    ext = extender(dataclasses.replace(CFG, filter_top_k=1), nodes=NODES)
    first = fitting(ext, "u1")
    assert len(first) == 1
    ext.unverified_seen(first[0])
    second = fitting(ext, "u2")
    assert len(second) == 1 and second != first
    for n in NODES:
        ext.unverified_seen(n)
    assert fitting(ext, "u3") == first
