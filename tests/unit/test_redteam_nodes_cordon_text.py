"""Red team (what comes from nodes): the text of a node's hami.io/device-cordon annotation reached the node's error
unescaped. A node short of healthy devices names the cordon entries that name no card of it (a hint for the
operator who wrote them); entries of up to 64 characters were quoted as written. Anyone who may write the Node's
annotations (its kubelet's identity among them) put a line break and terminal escapes there: the error, kept in the
ledger, printed them raw in `mtsched cards` (a forged row under the real one, the screen cleared), in the filter's
reason and in the node's Warning event. Every other value a node chooses is quoted (repr) in its error."""

from __future__ import annotations

from typing import Any

import pytest

from controller.cards import render_table
from shared.domain.node import node_inventory
from shared.domain.state import NodeSnapshot
from tests.unit._k8s import cfg


def _node(cordon: str) -> dict[str, Any]:
    c = cfg()
    return {"metadata": {"name": "n1", "annotations": {"hami.io/device-cordon": cordon}},
            "status": {"capacity": {c.resource_core_name: "32", c.resource_memory_name: "192"},
                       "allocatable": {c.resource_core_name: "16", c.resource_memory_name: "96"}}}


@pytest.mark.parametrize("entry", [
    "x\ngpu-9  gpu-9-mthreads-0  MTT S4000  0/96",  # a forged row of the card table
    "\x1b[2J\x1b[Hok",  # clear the screen
    "a\rb", "\u202eevil", "tab\there", "nul\x00",
])
def test_a_cordon_entry_is_quoted_in_the_nodes_error(entry: str) -> None:
    inv = node_inventory(_node(entry), cfg())
    assert "allocatable" in inv.error and "naming no card of this node" in inv.error
    assert inv.error.isprintable(), inv.error
    assert repr(entry) in inv.error  # quoted, as the error quotes every other value the node chose
    table = render_table({"n1": NodeSnapshot("n1", 1, error=inv.error, cards={})})
    assert len(table.splitlines()) == 2 and "\x1b" not in table  # the header and the node's one row


def test_a_plain_entry_is_still_named_as_written() -> None:
    inv = node_inventory(_node("other-mthreads-1, n1-mthreads-9"), cfg())
    assert "naming no card of this node: n1-mthreads-9, other-mthreads-1 (its cards" in inv.error
