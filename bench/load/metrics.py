"""What the roles' and kube-scheduler's /metrics say about a phase: latency, round trips, the
scheduling cycle."""

from __future__ import annotations

from collections import Counter
from typing import Any

from bench import prom
from bench.load.cluster import Target

SCRAPE_TIMEOUT = 60.0  # a role's /metrics is ~45 MB at 5,000 nodes (per-card gauges): seconds to generate


def scrape_all(target: Target) -> dict[str, prom.Scrape]:
    """Every role's /metrics (replicas summed), kube-scheduler's and the API server's. A role of which one URL
    could not be read is left out, not kept partial or empty: subtracted from a whole scrape at the phase's
    other end, it would turn the counters since the role started into the phase's (`window`)."""
    out: dict[str, prom.Scrape] = {}
    for kind, urls in target.metrics.items():
        parts = []
        for u in urls:
            try:
                parts.append(prom.scrape(u, timeout=SCRAPE_TIMEOUT))
            except OSError as e:
                print(f"  (could not scrape {u}: {e}; {kind} left out of this window)", flush=True)
        if len(parts) == len(urls):
            out[kind] = prom.merge(parts)
    if target.scheduler_metrics:
        try:
            out["kube-scheduler"] = prom.scrape(target.scheduler_metrics[0], token=target.scheduler_metrics[1])
        except OSError as e:
            print(f"  (could not scrape kube-scheduler: {e})", flush=True)
    if target.apiserver_metrics:
        try:
            # only the request counter is kept (prom.WANTED): the API server's whole exposition is megabytes
            out["kube-apiserver"] = prom.scrape(target.apiserver_metrics[0], token=target.apiserver_metrics[1],
                                                timeout=SCRAPE_TIMEOUT)
        except OSError as e:
            print(f"  (could not scrape kube-apiserver: {e})", flush=True)
    return out


def window(after: dict[str, prom.Scrape], before: dict[str, prom.Scrape]) -> dict[str, prom.Scrape]:
    """What each source counted between two scrapes, for the sources read at both ends only."""
    return {k: prom.diff(v, before[k]) for k, v in after.items() if k in before}


def scheduling_cycle(d: dict[str, prom.Scrape]) -> dict[str, Any]:
    """kube-scheduler's own view of the serial part of a pod's scheduling: the scheduling algorithm
    (its filters and scores, and the extender's filter and prioritize calls), one pod at a time."""
    s = d.get("kube-scheduler", {})
    name = "scheduler_scheduling_algorithm_duration_seconds"
    n = prom.total(s, f"{name}_count")
    if not n:
        return {}
    mean = prom.total(s, f"{name}_sum") / n
    cum = prom.buckets(s, name)
    return {"algorithm_runs": int(n), "mean_ms": round(mean * 1000, 3), "p50_ms": ms(prom.quantile(cum, 0.5)),
            "p99_ms": ms(prom.quantile(cum, 0.99)), "serial_bound_pods_s": round(1 / mean, 1) if mean else None}


def schedule_attempts(d: dict[str, prom.Scrape]) -> dict[str, int]:
    """kube-scheduler's scheduling attempts in the phase by result (scheduled, unschedulable, error), all
    profiles: an `error` is an attempt that failed for another reason than the pod not fitting (an
    extender call or a bind that failed), retried later; the issue's target is 0."""
    out: Counter[str] = Counter()
    for (name, labels), v in d.get("kube-scheduler", {}).items():
        if name == "scheduler_schedule_attempts_total" and v:
            out[dict(labels).get("result", "?")] += int(v)
    return dict(out)


def api_requests(d: dict[str, prom.Scrape], pods: int) -> dict[str, float]:
    """The API server's requests in the phase per pod bound, by "VERB resource[/subresource]" (all clients:
    the benchmark's creates, kube-scheduler, our roles, the API server's own): what a pod costs in API
    calls, ours beside plain. The API server counts a request when it completes, so a WATCH is counted
    when its stream ends (a timeout, or a watcher too slow for the burst that the API server closed)."""
    if not pods:
        return {}
    out: dict[str, float] = {}
    for (name, labels), v in d.get("kube-apiserver", {}).items():
        if name == "apiserver_request_total" and v > 0:
            lab = dict(labels)
            what = lab.get("resource", "") + (f"/{lab['subresource']}" if lab.get("subresource") else "")
            key = f"{lab.get('verb', '?')} {what or '(non-resource)'}"
            out[key] = out.get(key, 0.0) + v
    return {k: round(v / pods, 3) for k, v in sorted(out.items(), key=lambda kv: -kv[1]) if v / pods >= 0.005}


def batch_attempts(d: dict[str, prom.Scrape]) -> dict[str, dict[str, int]]:
    """kube-scheduler's OpportunisticBatching in the phase, per profile by result: it reuses the previous pod's
    filter and score results for a pod of the same signature, and is off for a profile with an extender
    (v1.36.3 `computeBatchablePlugins`), so only the plain profile can show hints: how much of the ratio
    it may explain."""
    out: dict[str, Counter[str]] = {}
    for (name, labels), v in d.get("kube-scheduler", {}).items():
        if name == "scheduler_batch_attempts_total" and v:
            lab = dict(labels)
            out.setdefault(lab.get("profile", "?"), Counter())[lab.get("result", "?")] += int(v)
    return {p: dict(c) for p, c in sorted(out.items())}


def ms(v: float | None) -> float | None:
    return None if v is None else round(v * 1000, 3)


def latency(d: dict[str, prom.Scrape], fine: bool) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    ext, hook = d.get("extender", {}), d.get("webhook", {})
    for verb in ("filter", "prioritize", "bind"):
        s = (prom.summary(ext, "mtsched_bench_seconds", verb=verb) if fine
             else prom.summary(ext, "mtsched_extender_request_seconds", verb=verb))
        out[verb] = {"count": s["count"], "mean_ms": ms(s["mean"]), "p50_ms": ms(s["p50"]), "p90_ms": ms(s["p90"]),
                     "p99_ms": ms(s["p99"])}
    s = (prom.summary(hook, "mtsched_bench_seconds", verb="webhook") if fine
         else prom.summary(hook, "mtsched_webhook_request_seconds"))
    out["webhook"] = {"count": s["count"], "mean_ms": ms(s["mean"]), "p50_ms": ms(s["p50"]), "p90_ms": ms(s["p90"]),
                      "p99_ms": ms(s["p99"])}
    if fine:  # where a bind's time goes (bench/timed_role.py)
        for part in ("filter.compute", "filter.compute_cpu", "filter.compute_gc", "prioritize.compute",
                     "bind.ledger_place", "bind.api_binding",
                     "bind.ledger_mark_bound", "bind.api_get_pod", "webhook.compute", "extender.loop_lag",
                     "webhook.loop_lag", *(f"{role}.gc.gen{g}" for role in ("extender", "webhook", "watcher")
                                           for g in range(3))):
            role, _, probe = part.partition(".")
            if probe == "loop_lag" or probe.startswith("gc."):  # every role's own probe: "<role>.<probe>"
                src, verb = d.get(role, {}), probe
            else:  # a verb's part, labelled as is (webhook.compute is the webhook's)
                src, verb = (hook if role == "webhook" else ext), part
            s = prom.summary(src, "mtsched_bench_seconds", verb=verb)
            if s["count"]:
                out[part] = {"count": s["count"], "mean_ms": ms(s["mean"]), "p50_ms": ms(s["p50"]),
                             "p90_ms": ms(s["p90"]), "p99_ms": ms(s["p99"])}
    # the product histogram's own verdict at the 5 ms bucket boundary (exact, whatever the resolution)
    for verb in ("filter", "prioritize", "bind"):
        cum = prom.buckets(ext, "mtsched_extender_request_seconds", verb=verb)
        n = cum[-1][1] if cum else 0
        le5 = next((c for le, c in cum if abs(le - 0.005) < 1e-9), None)
        out[verb]["share_le_5ms"] = round(le5 / n, 4) if n and le5 is not None else None
    return out


def round_trips(d: dict[str, prom.Scrape]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for kind, s in d.items():
        ops: Counter[str] = Counter()
        for (name, labels), v in s.items():
            if name == "mtsched_redis_round_trips_total" and v:
                ops[dict(labels).get("op", "?")] += int(v)
        out[kind] = dict(ops)
    return out
