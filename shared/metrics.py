"""Prometheus metrics of every role, and per-card gauges read from a replica's mirror at scrape time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from shared.models import UNIT_MIB

if TYPE_CHECKING:
    from shared.mirror import Mirror

BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

EXTENDER_SECONDS = Histogram("mtsched_extender_request_seconds", "Extender call latency", ["verb"], buckets=BUCKETS)
WEBHOOK_SECONDS = Histogram("mtsched_webhook_request_seconds", "Admission review latency", ["result"],
                            buckets=BUCKETS)
RESERVATIONS = Counter("mtsched_reservations_total", "Reservation attempts by outcome", ["result"])
CONFLICTS = Counter("mtsched_reservation_conflicts_total",
                    "Reservations refused because another replica booked first (refit and retried)")
RELEASES = Counter("mtsched_releases_total", "Reservations released", ["why"])
BINDINGS = Counter("mtsched_bindings_total", "Bind calls by outcome", ["result"])
ADMISSIONS = Counter("mtsched_admissions_total", "Admission decisions", ["result"])
WATCH_RELISTS = Counter("mtsched_watch_relists_total", "Full lists of a watched resource (start, 410 Gone, errors)",
                        ["resource"])
WATCH_RESUMES = Counter("mtsched_watch_resumes_total", "Watch streams resumed from the last resourceVersion",
                        ["resource"])
WATCH_EVENTS = Counter("mtsched_watch_events_total", "Watch events handled", ["resource", "type"])
ANNOTATION_ERRORS = Counter("mtsched_annotation_errors_total",
                            "Pods whose allocation record could not be decoded (their usage is kept, not freed)")
REDIS_ROUND_TRIPS = Counter("mtsched_redis_round_trips_total",
                            "Calls to Redis by the ledger, one per round trip (a pipeline counts once), by operation",
                            ["op"])
OVERCOMMIT = Counter("mtsched_overcommit_observed_total",
                     "Allocations observed on the API server that over-commit a card (should stay 0)")
RECORD_MISMATCH = Counter("mtsched_record_mismatch_total",
                          "Allocation records the ledger did not book (should stay 0): changed after our bind "
                          "(the booking is kept), or on a pod our scheduler does not place (foreign)", ["kind"])


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


async def metrics_handler(_: web.Request) -> web.Response:
    return web.Response(body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST})
TASK_FAILURES = Counter("mtsched_task_failures_total", "Supervised tasks that stopped and were restarted",
                        ["task", "kind"])
TASK_UP = Gauge("mtsched_task_up", "1 while a supervised task runs, 0 while it waits to be restarted", ["task"])
READY = Gauge("mtsched_ready", "1 when the role's readiness checks pass (what /readyz answers)")
RECONCILE_REPAIRS = Counter("mtsched_reconcile_repairs_total",
                            "Differences between the ledger and the API server that the reconciler repaired",
                            ["kind"])
RECONCILE_RUNS = Counter("mtsched_reconcile_runs_total", "Reconciliation passes over every node", ["result"])
RECONCILE_SECONDS = Histogram("mtsched_reconcile_seconds", "Duration of one reconciliation pass", buckets=BUCKETS)
LEDGER_REBUILDS = Counter("mtsched_ledger_rebuilds_total", "Full rebuilds of the ledger from the API server",
                          ["why"])
