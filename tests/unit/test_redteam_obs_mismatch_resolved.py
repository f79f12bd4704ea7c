"""The node watcher's log said a node's mismatch "is resolved" whenever its configuration problem went away, also
when the node still offers no card: its label fixed while the device plugin reports a device unhealthy (allocatable
below capacity, shared/domain/node.py). An operator reading "resolved" after fixing the label
expects the node's cards back (red team, observability)."""

from __future__ import annotations

import logging

import pytest

from controller.mismatch import MismatchReporter
from shared.domain.node import SGPU_CORES_LABEL, node_inventory
from tests.unit._k8s import cfg, node

C96 = cfg((96,))


def test_a_mismatch_that_leaves_the_node_closed_is_not_called_resolved(caplog: pytest.LogCaptureFixture) -> None:
    r = MismatchReporter(None, C96)
    bad = node("n1", cores=32, memory=192, labels={SGPU_CORES_LABEL: "0-1-2"})
    r.observe("n1", bad, node_inventory(bad, C96))
    assert set(r.problems) == {"n1"}
    fixed = node("n1", cores=32, memory=192, labels={SGPU_CORES_LABEL: "0-1"})
    fixed["status"]["allocatable"] = {C96.resource_core_name: "16", C96.resource_memory_name: "96"}
    inv = node_inventory(fixed, C96)
    assert inv.error and not inv.problem  # still no card offered, no longer a mismatch
    with caplog.at_level(logging.INFO, logger="mtsched.watchers"):
        r.observe("n1", fixed, inv)
    assert r.problems == {}
    text = caplog.text
    assert "n1" in text and "still offers no card" in text and "allocatable" in text, text
    caplog.clear()
    ok = node("n1", cores=32, memory=192, labels={SGPU_CORES_LABEL: "0-1"})
    r.observe("n1", bad, node_inventory(bad, C96))
    with caplog.at_level(logging.INFO, logger="mtsched.watchers"):
        r.observe("n1", ok, node_inventory(ok, C96))
    assert "is resolved" in caplog.text and "still offers no card" not in caplog.text
