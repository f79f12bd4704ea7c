"""Red team (outputs): `mtsched cards` and `mtsched explain` print what the ledger holds to an admin's terminal.
The watchers quote what a node wrote before it reaches the ledger (shared/domain/node.py), but a release before
that fix wrote a node's cordon entries as they were, and a roll runs two releases side by side: the table printed a
line break and a terminal escape raw, a forged row of the table. Every cell and line is escaped where it is
printed (shared.domain.shapes.printable)."""

from __future__ import annotations

from controller.cards import render_table
from controller.explain import to_text
from shared.domain.explain import explain
from shared.domain.state import CardRecord, NodeSnapshot, Reservation
from tests.unit._k8s import pod, slice_ctr
from tests.unit.test_explain import request

FORGED = ("devices unhealthy; hami.io/device-cordon entries naming no card of this node: x\n"
          "n9            n9-mthreads-0            MTT S4000  0/96 (0/48 GiB)      0/16   0/16    -       -           ok"
          "\x1b[2K\u202e")


def snaps() -> dict[str, NodeSnapshot]:
    card = CardRecord(0, 96, 32, 64, 16, 8, 8, 1, 16, "ok")
    return {"n1": NodeSnapshot("n1", 1, "", {0: card}, {"u": Reservation("u", (0,), 32, 8, 1, "bound", 0, pod="ns/a")}),
            "n2": NodeSnapshot("n2", 1, FORGED, {}, {})}


def _controls(text: str) -> list[str]:
    return sorted({hex(ord(c)) for c in text if not c.isprintable() and c != "\n"})


def test_the_card_table_prints_one_row_per_card_or_node_and_no_control() -> None:
    out = render_table(snaps())
    lines = out.split("\n")
    assert len(lines) == 3, lines  # header, n1's card, n2 (invalid): no forged row
    assert _controls(out) == []
    assert lines[2].startswith("n2") and r"this node: x\nn9" in lines[2] and r"\x1b[2K\u202e" in lines[2]


def test_explain_prints_no_control() -> None:
    e = explain("ns/p", request(pod(slice_ctr(memory=64, cores=4))), {}, snaps(), "binpack")
    out = to_text(e)
    assert _controls(out) == []
    assert not any(line.startswith("n9 ") for line in out.split("\n"))
    assert r"this node: x\nn9" in out
