"""offers_more: the node changes after which a pod our filter turned away may fit (a table)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shared.domain.node import Card, Inventory, offers_more

N = "gpu-1"


def inv(*cards: Card, error: str = "") -> Inventory:
    return Inventory(N, tuple(cards), error=error)


def card(i: int, capacity: int = 96, **kw: object) -> Card:
    return Card(N, i, capacity, **kw)  # type: ignore[arg-type]


C0, C1 = card(0), card(1)


@pytest.mark.parametrize(("before", "after", "more"), [
    (None, inv(C0), True),  # a new node
    (None, None, False),
    (inv(C0), None, False),  # deleted
    (None, inv(C0, error="96 units per card ..."), False),  # new but closed
    (inv(error="capacity ..."), inv(C0), True),  # open again after an error
    (inv(C0), inv(C0), False),  # the same
    (inv(C0), inv(C0, C1), True),  # one more card
    (inv(C0, C1), inv(C0), False),  # one card fewer
    (inv(replace(C0, healthy=False)), inv(C0), True),  # healthy again
    (inv(C0), inv(replace(C0, healthy=False)), False),
    (inv(replace(C0, cordoned=True)), inv(C0), True),  # cordon lifted
    (inv(C0), inv(replace(C0, cordoned=True)), False),
    (inv(C0, replace(C1, cordoned=True)), inv(replace(C0, cordoned=True), C1), True),  # another card opened
    (inv(C0), inv(replace(C0, max_slices=C0.max_slices + 1)), True),  # more slices
    (inv(C0), inv(replace(C0, max_slices=C0.max_slices - 1)), False),
    (inv(C0), inv(replace(C0, cores=C0.cores + 1)), True),
    (inv(card(0, 96)), inv(card(0, 160)), True),  # more memory
    (inv(card(0, 160)), inv(card(0, 96)), False),
    (inv(C0), inv(replace(C1, healthy=False)), False),  # the only new card is sick
])
def test_offers_more(before: Inventory | None, after: Inventory | None, more: bool) -> None:
    assert offers_more(before, after) is more
