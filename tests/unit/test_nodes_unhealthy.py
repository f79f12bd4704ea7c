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
