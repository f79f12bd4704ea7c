"""Red team (a node's cards changing under bound pods): what `mtsched cards` says of pods on a node that stopped
offering cards.

A node whose numbers the scheduler cannot use any more (its capacity turned into no configured model, its
sgpu.cores label edited wrong, its device plugin reporting devices unhealthy) keeps what running pods hold: their
cards stay in the ledger as `removed` placeholders, booked, until the pods end. Before, the card table printed
such a node as one `invalid` row with its reason and nothing else: the pods still running on its cards, and what
they hold, were gone from the one view the runbook sends the operator to ("what each card holds"), while a node
deleted under the same pods listed them."""

from __future__ import annotations

from controller.cards import render_table
from shared.domain.state import CardRecord, NodeSnapshot, Reservation


def test_an_invalid_node_still_shows_the_cards_its_running_pods_hold() -> None:
    held = CardRecord(5, 160, 160, 0, 16, 16, 0, 1, 16, "removed")
    snap = NodeSnapshot("gpu-1", 7, error="96 units per card (768/8) is no configured card model; memoryPerCard [160]",
                        cards={5: held},
                        reservations={"u1": Reservation("u1", (5,), 160, 16, 1, "bound", 1, 1, "ml/train")})
    lines = render_table({"gpu-1": snap}).splitlines()
    assert any("invalid" in line and "no configured card model" in line for line in lines)
    row = [line for line in lines if "gpu-1-mthreads-5" in line]
    assert len(row) == 1 and "ml/train" in row[0] and "160/160" in row[0] and "removed" in row[0]


def test_an_invalid_node_holding_nothing_is_one_row() -> None:
    snap = NodeSnapshot("gpu-2", 3, error="label mthreads.com/sgpu.cores='0-0' repeats a card id")
    assert len(render_table({"gpu-2": snap}).splitlines()) == 2  # the header and the node's row
