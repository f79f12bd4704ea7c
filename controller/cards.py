"""The card table: what every sliced card holds, from the ledger (pure rendering + its Redis reads)."""

from __future__ import annotations

from collections.abc import Mapping

from shared.config import Config
from shared.domain.models import CardModel
from shared.domain.shapes import printable
from shared.domain.state import NodeSnapshot
from shared.domain.upkeep import unkept_problem
from shared.store.ledger import Ledger


def _gib(units: int) -> str:
    g = units * 512 / 1024
    return f"{g:g}"


def render_table(snaps: Mapping[str, NodeSnapshot]) -> str:
    header = ("NODE", "CARD", "MODEL", "MEMORY USED/TOTAL", "CORES", "SLICES", "POLICY", "OVERCOMMIT", "HEALTH",
              "PODS")
    rows: list[tuple[str, ...]] = []
    for node in sorted(snaps):
        snap = snaps[node]
        if snap.error:
            rows.append((node, "-", "-", "-", "-", "-", "-", "-", "invalid", snap.error))
        # (a node in error offers none, but holds the cards its running pods hold, as `removed`: they are shown)
        for idx in sorted(snap.cards):
            c = snap.cards[idx]
            knobs = c.knobs
            pods = sorted(r.pod or r.uid for r in snap.reservations.values() if idx in r.cards)
            pending = sum(1 for r in snap.reservations.values() if idx in r.cards and r.state == "pending")
            rows.append((
                node, f"{node}-mthreads-{idx}", CardModel(c.capacity).name,
                f"{c.mem_used}/{c.capacity} ({_gib(c.mem_used)}/{_gib(c.capacity)} GiB)",
                f"{c.cores_used}/{c.cores}", f"{c.slices}/{c.slice_limit}",
                # the node agent's knobs; "-" when the node publishes none. Overcommit is shown, never booked
                # (docs/rules.md, "Card knobs"): MEMORY's total stays the card's physical memory
                knobs.describe_policy() if knobs else "-", f"{knobs.overcommit_ratio}%" if knobs else "-",
                # unverified: Redis restarted or failed over, nothing new is booked until the watchers compare it
                c.health if snap.verified else f"{c.health}, unverified",
                ", ".join(pods) + (f" ({pending} pending)" if pending else "")))
    # every cell escaped as printed: a node's error comes from the ledger, which a release before the watchers quoted
    # what nodes wrote filled with it raw (a line break forged a row, an escape drove the terminal: red team)
    rows = [tuple(map(printable, r)) for r in rows]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]]
    return "\n".join(lines)


async def card_table(ledger: Ledger, lost_after_seconds: int = Config.watchers_lost_after_seconds) -> str:
    """The table, and a last line when the extenders place nothing for want of a watcher (shared/domain/upkeep.py)."""
    snaps = await ledger.snapshots(await ledger.nodes())
    table = render_table(snaps) if snaps else "no sliced Moore Threads cards in the ledger"
    unkept = unkept_problem(await ledger.kept_age_ms(), lost_after_seconds)
    return f"{table}\nNOT KEPT: {unkept}" if unkept else table
