"""Per-card gauges read from a replica's mirror at scrape time (ours and HAMi's metric names).

Apart from shared/serving/metrics.py, which the ledger imports: the gauges need the mirror, which needs the ledger.

Rendered here in Prometheus's text format rather than through prometheus_client's collector: that re-validated
and re-escaped every label of every sample on each scrape, on the watcher's event loop (9 gauges per card:
36,000 samples at 500 nodes; the watcher's cProfile in `bench.load` spent two thirds of its CPU there, and at
5,000 nodes a scrape would hold the loop for seconds). Snapshots are immutable and carry a process-wide
`seq`, so a node's lines are rendered once per snapshot and a scrape re-renders only the nodes that changed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from shared.domain.models import UNIT_MIB
from shared.domain.state import CardRecord, NodeSnapshot
from shared.serving.metrics import add_exposition
from shared.store.mirror import Mirror

BYTES_PER_UNIT = UNIT_MIB * 1024 * 1024

# (metric, help, value of a card), in the order they are exposed
FAMILIES: tuple[tuple[str, str, Callable[[CardRecord], int]], ...] = (
    ("mtsched_card_memory_allocated_units", "Booked memory units", lambda c: c.mem_used),
    ("mtsched_card_memory_limit_units", "Card memory units", lambda c: c.capacity),
    ("mtsched_card_cores_allocated", "Booked core groups", lambda c: c.cores_used),
    ("mtsched_card_cores_limit", "Card core groups", lambda c: c.cores),
    ("mtsched_card_slices", "Slice instances on the card", lambda c: c.slices),
    ("mtsched_card_slices_limit", "Max slice instances", lambda c: c.slice_limit),
    ("hami_gpu_memory_limit_bytes", "HAMi-compatible", lambda c: c.capacity * BYTES_PER_UNIT),
    ("hami_gpu_memory_allocated_bytes", "HAMi-compatible", lambda c: c.mem_used * BYTES_PER_UNIT),
    ("hami_gpu_shared_count", "HAMi-compatible", lambda c: c.slices),
)
HEADERS = tuple(f"# HELP {m} {h}\n# TYPE {m} gauge\n" for m, h, _ in FAMILIES)


def _label(value: str) -> str:
    """A label value as the text format quotes it."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def node_lines(name: str, snap: NodeSnapshot) -> tuple[str, ...]:
    """The node's samples, one string per family (FAMILIES order), one line per card."""
    out: list[list[str]] = [[] for _ in FAMILIES]
    node = _label(name)
    for c in snap.cards.values():
        # label names sorted, as prometheus_client writes them (people grep for these lines)
        labels = (f'{{device_index="{c.index}",device_type="Mthreads",device_uuid="{node}-mthreads-{c.index}",'
                  f'node="{node}"}} ')
        for i, (metric, _, value) in enumerate(FAMILIES):
            out[i].append(f"{metric}{labels}{value(c)}\n")  # whole numbers: exact, as the format allows
    return tuple("".join(lines) for lines in out)


class CardExposition:
    """The per-card gauges of one mirror as text; a node's lines are cached until its snapshot changes."""

    def __init__(self, nodes: Callable[[], Mapping[str, NodeSnapshot]]):
        self.nodes = nodes
        self._cache: dict[str, tuple[int, tuple[str, ...]]] = {}

    def render(self) -> bytes:
        nodes = self.nodes()
        fresh: dict[str, tuple[int, tuple[str, ...]]] = {}
        parts: list[list[str]] = [[h] for h in HEADERS]
        for name in sorted(nodes):
            snap = nodes[name]
            hit = self._cache.get(name)
            if hit is None or hit[0] != snap.seq:
                hit = (snap.seq, node_lines(name, snap))
            fresh[name] = hit
            for part, chunk in zip(parts, hit[1], strict=True):
                part.append(chunk)
        self._cache = fresh  # nodes gone from the mirror are forgotten
        return "".join(s for part in parts for s in part).encode()


_registered: set[int] = set()


def register_mirror(mirror: Mirror) -> None:
    """Expose the mirror's cards on this process's /metrics. One mirror per process: a second block would
    declare every family again, which Prometheus refuses for the whole scrape (prometheus_client's registry
    refused the second collector at registration; so does this)."""
    if id(mirror) in _registered:
        return
    if _registered:
        raise ValueError("the per-card gauges of this process already come from another mirror")
    add_exposition(CardExposition(lambda: mirror.nodes).render)
    _registered.add(id(mirror))
