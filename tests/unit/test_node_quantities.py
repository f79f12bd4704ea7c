"""A Node's capacity and allocatable are read in every form the API server writes them: the kubelet's counts are
canonicalised (4000 -> "4k"), so a node with 25 S5000 cards (sgpu-memory 4000) offered no card: "not a whole
number" (the mutation red team's observation). A form the API server does not write for a count (a fraction, an
exponent, milli-units, a binary suffix) still closes the node."""

from __future__ import annotations

from typing import Any

import pytest

from shared.domain.node import node_inventory
from tests.unit._k8s import CORE, MEM, cfg, node

C160 = cfg((160,))


@pytest.mark.parametrize(("cores", "memory", "allocatable", "cards"), [
    ("400", "4k", None, 25),  # 25 S5000 cards, as the API server writes 4000
    ("400", "4000", None, 25),
    ("400", "4k", {MEM: "3840"}, 0),  # one card's memory missing from allocatable, no cordon: closed
    ("400", "4k", {MEM: "4k"}, 25),
    ("1600", "16k", {CORE: "1.6k"}, 0),  # no form the API server writes: closed
    ("1600", "16k", {CORE: "1584"}, 0),  # one card's cores missing from allocatable
    ("16k", "160k", None, 1000),  # (a fleet-sized node, as the form allows)
])
def test_capacity_in_the_api_servers_forms(cores: str, memory: str, allocatable: dict[str, str] | None,
                                           cards: int) -> None:
    n: dict[str, Any] = node("big", cores, memory)
    n["status"]["allocatable"].update(allocatable or {})
    inv = node_inventory(n, C160)
    assert len(inv.cards) == cards, inv.error


@pytest.mark.parametrize(("cores", "memory"), [("400", "4.5k"), ("400", "4000m"), ("400", "-4k"), ("40.5", "4k"),
                                               ("400", "4e3"), ("400", "4Ki"), ("400", "4k" + "0" * 40),
                                               ("400", "9E")])
def test_capacity_that_is_no_whole_number_closes_the_node(cores: str, memory: str) -> None:
    inv = node_inventory(node("big", cores, memory), C160)
    assert inv.cards == () and inv.error, inv
