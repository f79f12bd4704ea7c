"""A re-list of the nodes that failed part-way (Redis away while it wrote them) left the node watcher's view (`last`)
holding only the nodes written before the failure: the next re-list took every other node for one that newly offers
room and nudged each of them, a Node PATCH (and a follow-up) per node of the cluster while nothing had opened up.
A node that did open up while the watch was down is still nudged once. Real redis-server."""

from __future__ import annotations

from typing import Any

import pytest

from controller.node_watch import NodeWatcher
from shared.config import Config
from shared.store.ledger import Ledger
from tests.redis.test_redteam_node_arrival_nudge import _Kube, gpu

pytestmark = pytest.mark.redis


class _Outage(ConnectionError):  # Redis away: transient (a refusal no retry cures closes the node instead)
    pass


async def test_a_relist_after_a_failed_one_nudges_only_nodes_that_opened_up(
        ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    watcher = NodeWatcher(_Kube(), ledger, Config())  # type: ignore[arg-type]
    nudged: list[str] = []
    watcher.nudge = nudged.append
    names = [f"n{i}" for i in range(6)]
    await watcher.on_sync([gpu(n) for n in names])
    assert nudged == []  # the first list
    # the watch was down; meanwhile n5 gained a card. The re-list fails after writing two nodes (Redis away)
    listed = [gpu(n) for n in names[:5]] + [gpu("n5", cards=3)]
    real = ledger.upsert_node
    written: list[str] = []

    async def failing(inv: Any, create: bool = True) -> int:
        if len(written) >= 2:
            raise _Outage("redis away")
        written.append(inv.node)
        return await real(inv, create)

    monkeypatch.setattr(ledger, "upsert_node", failing)
    with pytest.raises(_Outage):
        await watcher.on_sync(listed)
    monkeypatch.setattr(ledger, "upsert_node", real)
    await watcher.on_sync(listed)  # Redis back: the reflector lists again
    assert sorted(nudged) == ["n5"]  # not every node the failed re-list had not written yet
    # and the ledger has n5's third card
    snap = (await ledger.snapshots(["n5"]))["n5"]
    assert snap is not None and len(snap.cards) == 3


async def test_a_relist_that_fails_at_its_first_node_nudges_nothing_unchanged(
        ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    watcher = NodeWatcher(_Kube(), ledger, Config())  # type: ignore[arg-type]
    nudged: list[str] = []
    watcher.nudge = nudged.append
    names = [f"m{i}" for i in range(4)]
    await watcher.on_sync([gpu(n) for n in names])

    async def failing(inv: Any, create: bool = True) -> int:
        raise _Outage("redis away")

    real = ledger.upsert_node
    monkeypatch.setattr(ledger, "upsert_node", failing)
    for _ in range(2):  # two failed re-lists in a row
        with pytest.raises(_Outage):
            await watcher.on_sync([gpu(n) for n in names])
    monkeypatch.setattr(ledger, "upsert_node", real)
    await watcher.on_sync([gpu(n) for n in names])
    assert nudged == []


async def test_an_event_whose_write_failed_is_written_and_nudged_when_replayed(
        ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reflector replays an event whose handler failed (Redis away): the watcher had taken the node as written
    (`last`) before the write, so the replay wrote nothing (the ledger kept the old node until a reconcile pass) and
    nudged nothing (the node looked unchanged): the pods turned away waited for kube-scheduler's flush."""
    watcher = NodeWatcher(_Kube(), ledger, Config())  # type: ignore[arg-type]
    nudged: list[str] = []
    watcher.nudge = nudged.append
    await watcher.on_sync([gpu("r1")])

    async def failing(inv: Any, create: bool = True) -> int:
        raise _Outage("redis away")

    real = ledger.upsert_node
    monkeypatch.setattr(ledger, "upsert_node", failing)
    with pytest.raises(_Outage):
        await watcher.on_event("MODIFIED", gpu("r1", cards=3))
    monkeypatch.setattr(ledger, "upsert_node", real)
    await watcher.on_event("MODIFIED", gpu("r1", cards=3))  # replayed from the resource version before it
    snap = (await ledger.snapshots(["r1"]))["r1"]
    assert snap is not None and sorted(snap.cards) == [0, 1, 2]
    assert nudged == ["r1"]
