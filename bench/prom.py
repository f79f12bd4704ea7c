"""Reading our roles' Prometheus /metrics: scrape, subtract two scrapes, quantiles from histogram buckets."""

from __future__ import annotations

import math
import ssl
import urllib.request
from collections.abc import Iterable, Mapping

from prometheus_client.parser import text_string_to_metric_families

Sample = tuple[str, tuple[tuple[str, str], ...]]  # (sample name, sorted labels)
Scrape = dict[Sample, float]


# What the load benchmark reads; the rest (per-card gauges: 9 per card, 72,000 lines at 1000 nodes) is
# dropped before parsing, which would otherwise take seconds per scrape.
WANTED = ("mtsched_bench_", "mtsched_extender_", "mtsched_webhook_", "mtsched_redis_", "mtsched_bindings",
          "mtsched_reservation", "mtsched_overcommit", "scheduler_scheduling_algorithm_duration_seconds",
          "scheduler_schedule_attempts", "scheduler_batch_attempts", "apiserver_request_total")


def _keep(line: str, prefixes: tuple[str, ...]) -> bool:
    if line.startswith("#"):
        parts = line.split(None, 3)
        return len(parts) > 2 and parts[2].startswith(prefixes)
    return line.startswith(prefixes)


def parse(text: str, prefixes: tuple[str, ...] | None = WANTED) -> Scrape:
    if prefixes:
        text = "\n".join(line for line in text.splitlines() if _keep(line, prefixes)) + "\n"
    out: Scrape = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


def scrape(url: str, timeout: float = 10.0, token: str = "") -> Scrape:
    """GET /metrics; with a bearer token (kube-scheduler's secure port, self-signed: not verified)."""
    req = urllib.request.Request(url)
    ctx = None
    if token:
        req.add_header("Authorization", f"Bearer {token}")
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    with urllib.request.urlopen(req, timeout=timeout, context=ctx) as resp:
        return parse(resp.read().decode())


def diff(after: Scrape, before: Scrape) -> Scrape:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def merge(scrapes: Iterable[Scrape]) -> Scrape:
    """Sum of several replicas' scrapes (histograms and counters add up)."""
    out: Scrape = {}
    for s in scrapes:
        for k, v in s.items():
            out[k] = out.get(k, 0.0) + v
    return out


def total(s: Scrape, name: str, **labels: str) -> float:
    """Sum of the samples called `name` whose labels include `labels`."""
    return sum(v for (n, ls), v in s.items() if n == name and all((k, val) in ls for k, val in labels.items()))


def buckets(s: Scrape, name: str, **labels: str) -> list[tuple[float, float]]:
    """Cumulative (upper bound, count) pairs of histogram `name` (name without _bucket), ascending."""
    out: dict[float, float] = {}
    for (n, ls), v in s.items():
        if n != f"{name}_bucket":
            continue
        d = dict(ls)
        if all(d.get(k) == val for k, val in labels.items()):
            le = float(d["le"])
            out[le] = out.get(le, 0.0) + v
    return sorted(out.items())


def quantile(cumulative: list[tuple[float, float]], q: float) -> float | None:
    """The q-quantile, linearly interpolated inside its bucket (as Prometheus' histogram_quantile)."""
    if not cumulative or cumulative[-1][1] <= 0:
        return None
    count = cumulative[-1][1]
    rank = q * count
    prev_le, prev_n = 0.0, 0.0
    for le, n in cumulative:
        if n >= rank:
            if math.isinf(le):
                return prev_le  # above the largest finite bucket: its bound is all we know
            if n == prev_n:
                return le
            return prev_le + (le - prev_le) * (rank - prev_n) / (n - prev_n)
        prev_le, prev_n = le, n
    return prev_le


def summary(s: Scrape, name: str, **labels: str) -> Mapping[str, float | None]:
    """count, mean, p50, p90, p99 (seconds) of one histogram in a scrape difference."""
    cum = buckets(s, name, **labels)
    count = cum[-1][1] if cum else 0.0
    sm = total(s, f"{name}_sum", **labels)
    return {"count": count, "mean": sm / count if count else None, "p50": quantile(cum, 0.5),
            "p90": quantile(cum, 0.9), "p99": quantile(cum, 0.99)}
