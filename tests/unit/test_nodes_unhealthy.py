"""A node closed because its device plugin reports devices unhealthy (allocatable below capacity, no cordon
covering it) offers no card, yet it is no configuration mismatch: before, nothing but the filter's reason, explain
and `mtsched cards` showed it (no gauge, event or alert), so a fleet losing nodes to sick cards went unseen. Now it
has the gauge `mtsched_nodes_devices_unhealthy`, a `NodeDevicesUnhealthy` Warning event (one per node a minute at
most, as the mismatch events) and the alert MtschedNodeDevicesUnhealthy."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import REGISTRY

from controller.mismatch import UNHEALTHY_REASON, MismatchReporter, event_body, event_name
from shared.domain.node import CORDON_ANNOTATION, node_inventory
from tests._wait import eventually
from tests.unit._k8s import cfg, node
from tests.unit._servers import PostingKube

C96 = cfg((96,))


def sick(name: str, cards: int = 2, sick_cards: int = 1, **kw: Any) -> dict[str, Any]:
    n = node(name, cores=16 * cards, memory=96 * cards, **kw)
    n["metadata"]["uid"] = f"uid-{name}"
    n["status"]["allocatable"] = {C96.resource_core_name: str(16 * (cards - sick_cards)),
                                  C96.resource_memory_name: str(96 * (cards - sick_cards))}
    return n


def gauge() -> float:
    v = REGISTRY.get_sample_value("mtsched_nodes_devices_unhealthy")
    assert v is not None
    return v


async def test_an_unhealthy_node_is_counted_and_gets_one_event_until_it_heals() -> None:
    api = PostingKube()
    r = MismatchReporter(api, C96)  # type: ignore[arg-type]
    bad = sick("gpu-1")
    inv = node_inventory(bad, C96)
    assert inv.error and not inv.problem
    r.observe("gpu-1", bad, inv)
    r.observe("gpu-1", bad, inv)  # heartbeat: same state, no second event
    r.synced({"gpu-1"})
    await asyncio.gather(*r._tasks)
    assert gauge() == 1 and set(r.unhealthy) == {"gpu-1"} and r.problems == {}  # no mismatch
    assert [e["reason"] for e in api.posted] == [UNHEALTHY_REASON]
    ev = api.posted[0]
    assert ev["type"] == "Warning" and "devices unhealthy" in ev["message"] and "allocatable" in ev["message"]
    assert ev["involvedObject"]["uid"] == "uid-gpu-1"
    # the operator cordons the sick card: the node offers its other card again, nothing is counted
    cordoned = sick("gpu-1", annotations={CORDON_ANNOTATION: "gpu-1-mthreads-1"})
    inv = node_inventory(cordoned, C96)
    assert not inv.error and len(inv.cards) == 2
    r.observe("gpu-1", cordoned, inv)
    assert gauge() == 0 and r.unhealthy == {}


async def test_deleted_and_unlisted_nodes_are_forgotten() -> None:
    r = MismatchReporter(None, C96)
    for name in ("a", "b"):
        n = sick(name)
        r.observe(name, n, node_inventory(n, C96))
    assert gauge() == 2
    r.observe("a", None, None)  # deleted
    assert gauge() == 1
    r.synced(set())  # re-listed: b is gone too
    assert gauge() == 0 and r.unhealthy == {}


def test_the_unhealthy_event_is_named_apart_from_mismatch_events() -> None:
    err = "mthreads.com/sgpu-core allocatable '16' is below (capacity 32): the device plugin reports devices unhealthy"
    name = event_name("n1", "u", "", err)
    assert ".mtsched-unhealthy." in name and name != event_name("n1", "u", "model", err)
    assert event_body("n1", "u", "", err, "hami-scheduler")["reason"] == UNHEALTHY_REASON


@pytest.mark.parametrize("healthy_again", [True, False])
async def test_a_mismatch_and_unhealthy_devices_are_told_apart(healthy_again: bool) -> None:
    """A node mismatched first (its model) and then only sick is counted once in each gauge in turn."""
    r = MismatchReporter(None, C96)
    s5000 = node("n", cores=32, memory=320)
    r.observe("n", s5000, node_inventory(s5000, C96))
    assert set(r.problems) == {"n"} and r.unhealthy == {}
    after = node("n", cores=32, memory=192) if healthy_again else sick("n")
    r.observe("n", after, node_inventory(after, C96))
    assert r.problems == {} and bool(r.unhealthy) is (not healthy_again) and gauge() == (0 if healthy_again else 1)


async def test_a_mismatch_and_unhealthy_devices_each_get_their_event_within_the_minute() -> None:
    """One node: its mismatch mended, its devices reported unhealthy a moment later. The two sorts of problem are
    limited apart (was: one limit per node, the second event held back and never sent)."""
    api = PostingKube()
    r = MismatchReporter(api, C96)  # type: ignore[arg-type]
    wrong = node("gpu-1", cores=32, memory=320)  # an S5000 under memoryPerCard [96]
    wrong["metadata"]["uid"] = "uid-gpu-1"
    r.observe("gpu-1", wrong, node_inventory(wrong, C96))
    bad = sick("gpu-1")
    r.observe("gpu-1", bad, node_inventory(bad, C96))
    await asyncio.gather(*r._tasks)
    assert sorted(e["reason"] for e in api.posted) == sorted(["NodeCardMismatch", UNHEALTHY_REASON]), api.posted


@pytest.mark.parametrize("heals", [False, True])
async def test_an_event_held_back_by_the_limit_is_sent_when_due_if_the_problem_lasts(
        monkeypatch: pytest.MonkeyPatch, heals: bool) -> None:
    """A second problem within the minute was logged and never reported by an event, however long it lasted. Now
    it is owed: sent when the limit allows, unless the node healed meanwhile."""
    import controller.mismatch as mismatch

    monkeypatch.setattr(mismatch, "EVENT_EVERY_SECONDS", 0.3)
    api = PostingKube()
    r = MismatchReporter(api, C96)  # type: ignore[arg-type]
    r.observe("gpu-1", sick("gpu-1"), node_inventory(sick("gpu-1"), C96))
    worse = sick("gpu-1", cards=2, sick_cards=2)  # another problem: both cards sick
    r.observe("gpu-1", worse, node_inventory(worse, C96))
    await asyncio.gather(*r._tasks)
    assert len(api.posted) == 1 and ("gpu-1", False) in r._owed  # held back
    if heals:
        well = node("gpu-1", cores=32, memory=192)
        r.observe("gpu-1", well, node_inventory(well, C96))
        await eventually(lambda: ("gpu-1", False) not in r._owed, within=5, what="the owed event dropped")
        await asyncio.gather(*r._tasks)
        assert len(api.posted) == 1, api.posted  # nothing to tell any more
        return
    await eventually(lambda: len(api.posted) == 2, within=5, what="the owed event sent")
    assert api.posted[1]["reason"] == UNHEALTHY_REASON and api.posted[1]["involvedObject"]["uid"] == "uid-gpu-1"
    assert api.posted[1]["message"] != api.posted[0]["message"]  # the problem as it is now


async def test_a_deleted_node_owes_no_event() -> None:
    api = PostingKube()
    r = MismatchReporter(api, C96)  # type: ignore[arg-type]
    r.observe("gpu-1", sick("gpu-1"), node_inventory(sick("gpu-1"), C96))
    worse = sick("gpu-1", cards=2, sick_cards=2)
    r.observe("gpu-1", worse, node_inventory(worse, C96))
    assert r._owed
    r.observe("gpu-1", None, None)
    assert r._owed == {} and r._event_at == {}
    r.observe("gpu-2", sick("gpu-2"), node_inventory(sick("gpu-2"), C96))
    worse2 = sick("gpu-2", cards=2, sick_cards=2)
    r.observe("gpu-2", worse2, node_inventory(worse2, C96))
    r.synced(set())  # re-listed: gone
    assert r._owed == {} and r._event_at == {}
    await asyncio.gather(*r._tasks)
