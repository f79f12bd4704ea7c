"""Node-to-cards rules no other test pinned down (red team, mutants): each case names the small bug in
shared/domain/node.py it guards against, and fails with that bug in place."""

from __future__ import annotations

from typing import Any

import pytest

from shared.domain.node import CORDON_ANNOTATION, node_inventory
from tests.unit._k8s import CORE, MEM, cfg, node

C96 = cfg((96,))


# mutant: a cordon entry that is a bare card index ("1") cordons that card; docs/rules.md: a bare index names no
# card and cordons nothing (the entries are device ids, <node>-mthreads-<index>)
@pytest.mark.parametrize(("entries", "cordoned"), [
    ("1", ()),
    ("n1-mthreads-1", (1,)),
    ("0, n1-mthreads-1", (1,)),
    ("n1-mthreads-0,n1-mthreads-1", (0, 1)),
    ("n2-mthreads-0", ()),  # another node's card
])
def test_only_a_device_id_of_the_node_cordons_a_card(entries: str, cordoned: tuple[int, ...]) -> None:
    inv = node_inventory(node("n1", 32, 192, annotations={CORDON_ANNOTATION: entries}), C96)
    assert inv.error == ""
    assert tuple(c.index for c in inv.cards if c.cordoned) == cordoned
    assert all(c.health == ("cordoned" if c.index in cordoned else "ok") for c in inv.cards)


# mutant: an allocatable amount that is no whole number is let pass (only one below capacity closes the node): the
# node then offers cards while nothing says which devices are healthy
@pytest.mark.parametrize(("resource", "value"), [(CORE, "lots"), (MEM, "191.5"), (CORE, "-32")])
def test_an_allocatable_amount_that_is_no_whole_number_offers_no_card(resource: str, value: str) -> None:
    n: dict[str, Any] = node("n1", 32, 192)
    n["status"]["allocatable"][resource] = value
    inv = node_inventory(n, C96)
    assert inv.cards == () and f"{resource} allocatable {value!r} is not a whole number (capacity" in inv.error
