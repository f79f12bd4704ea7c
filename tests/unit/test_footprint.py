"""The pod-footprint rule (what a pod's containers hold at once, as Kubernetes runs them), once: a table
through `footprint`, then the request parser and the annotation decoder agreeing on the same pods."""

from __future__ import annotations

from typing import Any

import pytest

from shared.domain.annotations import ALLOCATED, CardGrant, device_id, encode_allocation, usage_from_annotations
from shared.domain.lifecycle import APP, INIT, SIDECAR, Footprint, footprint
from shared.domain.models import UNIT_MIB
from shared.domain.request import pod_request
from tests.unit._k8s import cfg, ctr, pod, slice_ctr

Part = tuple[str, int, int, int]  # (kind, memory, cores, slices) of one container


def app(memory: int, cores: int) -> Part:
    return (APP, memory, cores, 1)


def init(memory: int, cores: int) -> Part:
    return (INIT, memory, cores, 1)


def sidecar(memory: int, cores: int) -> Part:
    return (SIDECAR, memory, cores, 1)


NONE: Part = (APP, 0, 0, 0)  # a container without cards
NONE_INIT: Part = (INIT, 0, 0, 0)


@pytest.mark.parametrize(("parts", "want"), [
    ((), Footprint(0, 0, 0)),
    ((NONE, NONE_INIT), Footprint(0, 0, 0)),  # holding nothing is not a slice
    ((app(8, 2),), Footprint(8, 2, 1)),
    ((app(8, 2), app(16, 4)), Footprint(24, 6, 2)),  # app containers run together: sum
    ((init(32, 8), init(16, 12)), Footprint(32, 12, 1)),  # init containers one at a time: max, per resource
    ((init(64, 8), app(16, 4), app(32, 2)), Footprint(64, 8, 2)),  # init peak above the apps' sum
    ((init(8, 1), app(32, 4), app(32, 4)), Footprint(64, 8, 2)),  # apps' sum above the init peak
    ((init(64, 1), app(16, 8)), Footprint(64, 8, 1)),  # memory from the init, cores from the app
    ((NONE_INIT, init(4, 2), NONE, app(2, 1)), Footprint(4, 2, 1)),  # empty containers count for nothing
    ((init(4, 0),), Footprint(4, 0, 1)),  # a 0-core slice still holds the card
    ((sidecar(32, 2), app(32, 2)), Footprint(64, 4, 2)),  # a sidecar runs beside the apps
    ((sidecar(8, 1), init(64, 4), app(8, 1)), Footprint(72, 5, 2)),  # ... and beside later init containers
    ((init(64, 4), sidecar(8, 1), app(8, 1)), Footprint(64, 4, 2)),  # not beside earlier ones
])
def test_footprint(parts: tuple[Part, ...], want: Footprint) -> None:
    assert footprint(parts) == want


@pytest.mark.parametrize("p", [
    pod(slice_ctr("a", 16, 4)),
    pod(slice_ctr("a", 16, 4), slice_ctr("b", 32, 2), init=[slice_ctr("setup", 64, 8)]),
    pod(slice_ctr("a", 32, 4), slice_ctr("b", 32, 4), init=[slice_ctr("setup", 8, 1)]),
    pod(ctr("plain"), slice_ctr("a", 8, 1), init=[ctr("fetch"), slice_ctr("setup", 64, 16)]),
])
def test_request_parser_and_annotation_decoder_agree(p: dict[str, Any]) -> None:
    # What the scheduler books from the request is what the bound pod's record is read back as.
    req = pod_request(p, cfg((96,)))
    assert req is not None
    grants = [[CardGrant(device_id("n1", 2), s.memory * UNIT_MIB, s.cores)] if not s.empty else []
              for s in req.shares]
    bound = {**p, "spec": {**p["spec"], "nodeName": "n1"},
             "metadata": {"annotations": {ALLOCATED: encode_allocation(grants)}}}
    usage = usage_from_annotations(bound)
    assert usage is not None
    assert (usage.memory, usage.cores, usage.slices) == (req.memory, req.cores, req.slices)
