"""The results: one summary row per (nodes, replicas), the printed tables, the JSON files and the plot."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from bench import prom
from bench.load.metrics import latency, round_trips
from bench.load.phase import Phase


def _mean_dicts(ds: list[dict[str, float]]) -> dict[str, float]:
    keys = sorted({k for d in ds for k in d})
    out = {k: round(statistics.fmean([d.get(k, 0.0) for d in ds]), 2) for k in keys} if ds else {}
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def summarize(phases: list[Phase], fine: bool) -> list[dict[str, Any]]:
    rows = []
    keys = sorted({(p.nodes, str(p.replicas)) for p in phases}, key=lambda k: (k[0], k[1]))
    for nodes, replicas in keys:
        def sel(mode: str, nodes: int = nodes, replicas: str = replicas) -> list[Phase]:
            return [p for p in phases if p.nodes == nodes and str(p.replicas) == replicas and p.mode == mode]

        ours, plain, paced = sel("ours"), sel("plain"), sel("paced")
        if not ours and not paced:
            continue
        o = [p.result["throughput_pods_s"] for p in ours]
        pl = [p.result["throughput_pods_s"] for p in plain]
        merged = {k: prom.merge(p.diff.get(k, {}) for p in ours) for k in ("extender", "webhook", "watcher")}
        bound = sum(p.result["bound"] for p in ours)
        rt = round_trips(merged)
        checked = ours + paced
        corr = [p.result.get("correctness", {}) for p in checked]
        row: dict[str, Any] = {
            "nodes": nodes, "replicas": replicas, "runs": len(ours),
            "ours_pods_s": round(statistics.fmean(o), 1) if o else None, "ours_pods_s_all": o,
            "plain_pods_s": round(statistics.fmean(pl), 1) if pl else None, "plain_pods_s_all": pl,
            "ratio": round(statistics.fmean(o) / statistics.fmean(pl), 3) if o and pl and statistics.fmean(pl)
            else None,
            "latency_ms": latency(merged, fine),
            "filter_nodes_mean": round(statistics.fmean([p.result["filter_nodes_mean"] for p in checked
                                                         if p.result.get("filter_nodes_mean")] or [0]), 1),
            "redis_per_pod_extender": round(sum(rt.get("extender", {}).values()) / bound, 3) if bound else None,
            "redis_per_pod_watcher": round(sum(rt.get("watcher", {}).values()) / bound, 3) if bound else None,
            "cpu_ms_per_pod_ours": _mean_dicts([p.result.get("cpu_ms_per_pod", {}) for p in ours]),
            "cpu_ms_per_pod_plain": _mean_dicts([p.result.get("cpu_ms_per_pod", {}) for p in plain]),
            "scheduler_algorithm_ms_ours": round(statistics.fmean(
                [p.result["scheduling_cycle"]["mean_ms"] for p in ours if p.result.get("scheduling_cycle")] or [0]), 2),
            "scheduler_algorithm_ms_plain": round(statistics.fmean(
                [p.result["scheduling_cycle"]["mean_ms"] for p in plain if p.result.get("scheduling_cycle")] or [0]),
                2),
            "overcommitted_cards_ledger": sum(c.get("overcommitted_cards_ledger", 0) for c in corr),
            "overcommitted_cards_annotations": sum(c.get("overcommitted_cards_annotations", 0) for c in corr),
            "ledger_annotation_mismatches": sum(c.get("ledger_annotation_mismatches", 0) for c in corr),
            "unannotated_bound": sum(c.get("unannotated_bound", 0) for c in corr),
            "leaked_reservations": sum(p.result.get("leaked_reservations", 0) for p in checked),
            "pending_after_timeout": sum(c.get("pending", 0) for c in corr),
            "pods_checked": sum(p.result["pods"] for p in checked),
            # per phase (burst phases, then paced): the policy's packing, nodes and cards holding a slice
            "nodes_used": [c.get("nodes_used") for c in corr], "cards_used": [c.get("cards_used") for c in corr],
        }
        if paced:
            pm = {k: prom.merge(p.diff.get(k, {}) for p in paced) for k in ("extender", "webhook", "watcher")}
            pb = sum(p.result["bound"] for p in paced)
            prt = round_trips(pm)
            row.update(paced_rate=paced[0].result["rate"],
                       paced_pods_s=round(statistics.fmean([p.result["throughput_pods_s"] for p in paced]), 1),
                       latency_paced_ms=latency(pm, fine),
                       redis_per_pod_extender_paced=round(sum(prt.get("extender", {}).values()) / pb, 3) if pb
                       else None)
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]], micro: list[dict[str, Any]]) -> str:
    def f(v: Any, nd: int = 1) -> str:
        return "-" if v is None else (f"{v:.{nd}f}" if isinstance(v, float) else str(v))

    def pp(lat: dict[str, Any] | None, verb: str) -> str:
        if not lat or verb not in lat:
            return "-"
        return f"{f(lat[verb]['p50_ms'], 2)}/{f(lat[verb]['p99_ms'], 2)}"

    def grid(head: tuple[str, ...], body: list[list[str]]) -> list[str]:
        return [" | ".join(head), " | ".join("-" * len(h) for h in head)] + [" | ".join(r) for r in body]

    lines = ["Throughput (pods created all at once; pods/s from first create to last bind)"]
    lines += grid(("nodes", "ext", "ours/s", "plain/s", "ratio", "sched algo ms ours/plain", "CPU ms/pod ours/plain",
                   "RT/pod", "overcommit", "unannot", "leaks", "pending"),
                  [[str(r["nodes"]), r["replicas"], f(r["ours_pods_s"]), f(r["plain_pods_s"]), f(r["ratio"], 2),
                    f"{f(r['scheduler_algorithm_ms_ours'])}/{f(r['scheduler_algorithm_ms_plain'])}",
                    f"{f(sum(r['cpu_ms_per_pod_ours'].values()))}/{f(sum(r['cpu_ms_per_pod_plain'].values()))}",
                    f(r["redis_per_pod_extender"], 2),
                    f"{r['overcommitted_cards_ledger']}+{r['overcommitted_cards_annotations']}",
                    str(r["unannotated_bound"]), str(r["leaked_reservations"]), str(r["pending_after_timeout"])]
                   for r in rows])
    lines += ["", "Packing (node policy): nodes/cards holding a slice after each burst, then paced, phase: "
              + "; ".join(f"{r['nodes']} nodes ext {r['replicas']}: " + ", ".join(
                  f"{n}/{c}" for n, c in zip(r["nodes_used"], r["cards_used"], strict=True)) for r in rows)]
    lines += ["", "Latency p50/p99 ms, handler time (filter.compute: the verb's own work)"]
    body = []
    for r in rows:
        for label, key in (("burst", "latency_ms"), (f"{f(r.get('paced_rate'), 0)}/s", "latency_paced_ms")):
            lat = r.get(key)
            if lat:
                body.append([str(r["nodes"]), r["replicas"], label, f(r["filter_nodes_mean"], 0), pp(lat, "filter"),
                             pp(lat, "filter.compute"), pp(lat, "prioritize"), pp(lat, "bind"), pp(lat, "webhook")])
    lines += grid(("nodes", "ext", "load", "names", "filter", "filter.compute", "prioritize", "bind", "webhook"), body)
    if micro:
        lines.append("")
        lines.append("in-process Extender.filter (no HTTP): " + "; ".join(
            f"{m['candidates']} of {m['nodes']} nodes: p50 {m['filter_p50_ms']:.2f} ms, p99 {m['filter_p99_ms']:.2f} ms"
            f" (prioritize p99 {m['prioritize_p99_ms']:.2f} ms; first call per request shape "
            f"{m['filter_cold_mean_ms']:.2f} ms)" for m in micro))
    lines.append("RT/pod = the extender's Redis round trips per bound pod; overcommit = cards over-committed in the "
                 "ledger + recomputed from annotations; p99 from 8 %-wide buckets")
    return "\n".join(lines)


def save(doc: dict[str, Any], out_dir: Path) -> None:
    from bench.plot import plot

    text = json.dumps(doc, indent=2, default=str)
    path = out_dir / f"run-{doc['run_id']}.json"
    path.write_text(text)
    (out_dir / "latest.json").write_text(text)
    if doc["summary"]:
        print()
        print(table(doc["summary"], doc["micro"]))
        try:
            plot(doc, out_dir / "throughput.png")
            print(f"plot: {out_dir / 'throughput.png'}")
        except Exception as e:
            print(f"plot failed: {type(e).__name__}: {e}")
    print(f"results: {path} (and latest.json)", flush=True)
