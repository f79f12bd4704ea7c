"""Per-card gauges read from a replica's mirror at scrape time (ours and HAMi's metric names).

Apart from shared/serving/metrics.py, which the ledger imports: the gauges need the mirror, which needs the ledger.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from shared.domain.models import UNIT_MIB
from shared.store.mirror import Mirror


class CardCollector(Collector):
    """Per-card allocation and limit gauges from the mirror (ours and HAMi's metric names)."""

    def __init__(self, mirror: Mirror):
        self.mirror = mirror

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["node", "device_uuid", "device_index", "device_type"]
        fams = {
            "mem_alloc": GaugeMetricFamily("mtsched_card_memory_allocated_units", "Booked memory units", labels=labels),
            "mem_limit": GaugeMetricFamily("mtsched_card_memory_limit_units", "Card memory units", labels=labels),
            "core_alloc": GaugeMetricFamily("mtsched_card_cores_allocated", "Booked core groups", labels=labels),
            "core_limit": GaugeMetricFamily("mtsched_card_cores_limit", "Card core groups", labels=labels),
            "slices": GaugeMetricFamily("mtsched_card_slices", "Slice instances on the card", labels=labels),
            "slice_limit": GaugeMetricFamily("mtsched_card_slices_limit", "Max slice instances", labels=labels),
            "hami_mem_limit": GaugeMetricFamily("hami_gpu_memory_limit_bytes", "HAMi-compatible", labels=labels),
            "hami_mem_alloc": GaugeMetricFamily("hami_gpu_memory_allocated_bytes", "HAMi-compatible", labels=labels),
            "hami_shared": GaugeMetricFamily("hami_gpu_shared_count", "HAMi-compatible", labels=labels),
        }
        for node, snap in sorted(self.mirror.nodes.items()):
            for c in snap.cards.values():
                lv = [node, f"{node}-mthreads-{c.index}", str(c.index), "Mthreads"]
                fams["mem_alloc"].add_metric(lv, c.mem_used)
                fams["mem_limit"].add_metric(lv, c.capacity)
                fams["core_alloc"].add_metric(lv, c.cores_used)
                fams["core_limit"].add_metric(lv, c.cores)
                fams["slices"].add_metric(lv, c.slices)
                fams["slice_limit"].add_metric(lv, c.slice_limit)
                fams["hami_mem_limit"].add_metric(lv, c.capacity * UNIT_MIB * 1024 * 1024)
                fams["hami_mem_alloc"].add_metric(lv, c.mem_used * UNIT_MIB * 1024 * 1024)
                fams["hami_shared"].add_metric(lv, c.slices)
        yield from fams.values()


_registered: set[int] = set()


def register_mirror(mirror: Mirror) -> None:
    if id(mirror) not in _registered:
        REGISTRY.register(CardCollector(mirror))
        _registered.add(id(mirror))
