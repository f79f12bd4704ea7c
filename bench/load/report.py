"""The results: one summary row per (nodes, replicas), the printed tables, the JSON files and the plot."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from bench import prom
from bench.load import memory
from bench.load.metrics import latency, round_trips
from bench.load.phase import Phase


def _mean_dicts(ds: list[dict[str, float]]) -> dict[str, float]:
    keys = sorted({k for d in ds for k in d})
    out = {k: round(statistics.fmean([d.get(k, 0.0) for d in ds]), 2) for k in keys} if ds else {}
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _max_dicts(ds: list[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for d in ds:
        for k, v in d.items():
            out[k] = max(out.get(k, v), v)
    return out


def memory_fields(ours: list[Phase], large: list[Phase], every: list[Phase], nodes_rec: dict[str, Any] | None,
                  extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """RSS growth per 1,000 nodes / pods / large pods and peak RSS per role (MiB). Growth per pod is
    the largest among the runs: a later run reuses memory the previous one freed."""
    def grow(ps: list[Phase]) -> dict[str, float] | None:
        if not ps:
            return None
        return memory.by_role(_max_dicts([p.result.get("rss_mib_per_1000_pods", {}) for p in ps]), extra)

    peak = _max_dicts([p.result.get("hwm_mib_bound", {}) for p in every])
    return {
        "rss_mib_per_1000_nodes": memory.by_role(nodes_rec["rss_mib_per_1000_nodes"], extra) if nodes_rec else None,
        "rss_mib_per_1000_pods": grow(ours),
        "rss_mib_per_1000_large_pods": grow(large),
        "large_annotation_kb": large[0].large_kb if large else None,
        "rss_mib_peak": memory.by_role(peak, extra),
    }


def unbound(p: Phase) -> int:
    """Pods of the phase that were not bound: refused at create, or still pending when it timed out. Its
    pods/s counts the bound ones only, so a phase with any is not the same work as a complete one."""
    return max(0, int(p.result.get("pods", 0)) - int(p.result.get("bound", 0)))


def pair_ratios(ours: list[Phase], plain: list[Phase]) -> list[float]:
    """ours/plain pods/s per --repeat round that has both, each of them complete (every pod bound), in round
    order."""
    by_rep = {p.rep: p.result["throughput_pods_s"] for p in plain if not unbound(p)}
    return [round(o.result["throughput_pods_s"] / by_rep[o.rep], 3) for o in sorted(ours, key=lambda p: p.rep)
            if by_rep.get(o.rep) and not unbound(o)]


def mean_of(values: list[float], nd: int = 2) -> float | None:
    """The mean, or None when nothing was measured (no kube-scheduler scrape, no filter call): not 0."""
    return round(statistics.fmean(values), nd) if values else None


def algorithm_ms(ps: list[Phase]) -> float | None:
    """kube-scheduler's algorithm time per pod, mean over the phases where its /metrics were read."""
    return mean_of([p.result["scheduling_cycle"]["mean_ms"] for p in ps if p.result.get("scheduling_cycle")])


def cpu_total(per_process: dict[str, float]) -> float | None:
    """CPU ms per pod over every process; None without CPU accounting (--kubeconfig)."""
    return sum(per_process.values()) if per_process else None


def checked_sum(values: list[Any]) -> int | None:
    """The sum of a counter over the phases that checked it; None when none did (no ledger, kube-scheduler's
    /metrics not read): a counter nobody looked at is not 0."""
    seen = [int(v) for v in values if v is not None]
    return sum(seen) if seen else None


def attempts_error(ps: list[Phase]) -> int | None:
    """kube-scheduler's attempts that erred in these phases; None when its /metrics were read in none of them."""
    return checked_sum([None if p.result.get("schedule_attempts") is None
                        else p.result["schedule_attempts"].get("error", 0) for p in ps])


def summarize(phases: list[Phase], fine: bool, node_memory: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """One row per (nodes, replicas, percentageOfNodesToScore); an external extender's runs at the same
    nodes and percentage go into every such row, beside ours and plain."""
    rows = []
    keys = sorted({(p.nodes, str(p.replicas), p.percentage) for p in phases if p.mode != "external"},
                  key=lambda k: (k[0], k[2], k[1]))
    for nodes, replicas, pct in keys:
        def sel(mode: str, nodes: int = nodes, replicas: str = replicas, pct: int = pct) -> list[Phase]:
            return [p for p in phases if p.nodes == nodes and p.percentage == pct and p.mode == mode
                    and (mode == "external" or str(p.replicas) == replicas)]

        ours, plain, paced, large, ext = sel("ours"), sel("plain"), sel("paced"), sel("large"), sel("external")
        plain2 = sel("plain2")
        if not ours and not paced and not large:
            continue
        o = [p.result["throughput_pods_s"] for p in ours]
        pl = [p.result["throughput_pods_s"] for p in plain]
        merged = {k: prom.merge(p.diff.get(k, {}) for p in ours) for k in ("extender", "webhook", "watcher")}
        bound = sum(p.result["bound"] for p in ours)
        rt = round_trips(merged)
        checked = ours + paced + large
        corr = [p.result.get("correctness", {}) for p in checked]
        row: dict[str, Any] = {
            "nodes": nodes, "replicas": replicas, "percentage_of_nodes_to_score": pct, "runs": len(ours),
            "ours_pods_s": round(statistics.fmean(o), 1) if o else None, "ours_pods_s_all": o,
            "plain_pods_s": round(statistics.fmean(pl), 1) if pl else None, "plain_pods_s_all": pl,
            # only when every ours and plain phase bound all its pods: otherwise the two did not place the same work
            "ratio": round(statistics.fmean(o) / statistics.fmean(pl), 3)
            if o and pl and statistics.fmean(pl) and not any(unbound(p) for p in ours + plain) else None,
            # pods refused at create or left pending at --timeout, in ours (+ paced, large) and in plain (+ plain2)
            "unbound_pods": sum(unbound(p) for p in ours + paced + large),
            "unbound_pods_plain": sum(unbound(p) for p in plain + plain2),
            # each pair's own ratio (ours and plain of the same --repeat round, run back to back): the spread
            # the machine's drift leaves in one cell
            "ratio_pairs": pair_ratios(ours, plain),
            "latency_ms": latency(merged, fine),
            "filter_nodes_mean": mean_of([p.result["filter_nodes_mean"] for p in checked
                                          if p.result.get("filter_nodes_mean")], 1),
            "redis_per_pod_extender": round(sum(rt.get("extender", {}).values()) / bound, 3) if bound else None,
            "redis_per_pod_watcher": round(sum(rt.get("watcher", {}).values()) / bound, 3) if bound else None,
            "cpu_ms_per_pod_ours": _mean_dicts([p.result.get("cpu_ms_per_pod", {}) for p in ours]),
            "cpu_ms_per_pod_plain": _mean_dicts([p.result.get("cpu_ms_per_pod", {}) for p in plain]),
            "api_requests_per_pod_ours": _mean_dicts([p.result.get("api_requests_per_pod", {}) for p in ours]),
            "api_requests_per_pod_plain": _mean_dicts([p.result.get("api_requests_per_pod", {}) for p in plain]),
            "scheduler_algorithm_ms_ours": algorithm_ms(ours),
            "scheduler_algorithm_ms_plain": algorithm_ms(plain),
            # None: not checked in any phase (no ledger: --kubeconfig without --redis-url)
            "overcommitted_cards_ledger": checked_sum([c.get("overcommitted_cards_ledger") for c in corr]),
            "overcommitted_cards_annotations": sum(c.get("overcommitted_cards_annotations", 0) for c in corr),
            "ledger_annotation_mismatches": checked_sum([c.get("ledger_annotation_mismatches") for c in corr]),
            # phases whose bookings were not all in the ledger and bound (confirmed) after checks.SETTLE_SECONDS: a
            # pod bound on a booking left pending matches its record card for card (0 over-committed, 0 mismatches)
            "ledger_unsettled_phases": checked_sum([None if c.get("ledger_settled") is None
                                                    else int(not c["ledger_settled"]) for c in corr]),
            "unannotated_bound": sum(c.get("unannotated_bound", 0) for c in corr),
            # bound pods whose allocation record did not decode: out of the over-commit recomputed from annotations
            "undecodable_records": sum(c.get("undecodable", 0) for c in corr),
            "leaked_reservations": checked_sum([p.result.get("leaked_reservations") for p in checked]),
            "pending_after_timeout": sum(c.get("pending", 0) for c in corr),
            "pods_checked": sum(p.result["pods"] for p in checked),
            # kube-scheduler's attempts that failed for another reason than "does not fit" (target: 0); None:
            # its /metrics were not read (--kubeconfig, or a failed scrape)
            "schedule_attempts_error": attempts_error(checked),
            "schedule_attempts_error_plain": attempts_error(plain),
            # per phase (burst phases, then paced): the policy's packing, nodes and cards holding a slice
            "nodes_used": [c.get("nodes_used") for c in corr], "cards_used": [c.get("cards_used") for c in corr],
        }
        if plain2:  # --also-plain2: the baseline of runs before 2026-12-04, side by side
            p2 = [p.result["throughput_pods_s"] for p in plain2]
            m2 = statistics.fmean(p2)
            row.update({"plain2_pods_s": round(m2, 1), "plain2_pods_s_all": p2,
                        "ratio_plain2": round(statistics.fmean(o) / m2, 3) if o and m2 else None,
                        "cpu_ms_per_pod_plain2": _mean_dicts([p.result.get("cpu_ms_per_pod", {}) for p in plain2]),
                        "scheduler_algorithm_ms_plain2": algorithm_ms(plain2)})
        rec = next((m for m in node_memory or [] if m["nodes"] == nodes and str(m["replicas"]) == replicas
                    and m["percentage"] == pct), None)
        row.update(memory_fields(ours, large, ours + paced + large, rec))
        if ext:
            e = [p.result["throughput_pods_s"] for p in ext]
            ecorr = [p.result.get("correctness", {}) for p in ext]
            name = str(ext[0].replicas)
            row.update(
                external=name, external_pods_s=round(statistics.fmean(e), 1), external_pods_s_all=e,
                external_ratio=round(statistics.fmean(e) / statistics.fmean(pl), 3)
                if pl and statistics.fmean(pl) and not any(unbound(p) for p in ext + plain) else None,
                external_unbound_pods=sum(unbound(p) for p in ext),
                scheduler_algorithm_ms_external=algorithm_ms(ext),
                cpu_ms_per_pod_external=_mean_dicts([p.result.get("cpu_ms_per_pod", {}) for p in ext]),
                external_overcommitted_cards_annotations=sum(c.get("overcommitted_cards_annotations", 0)
                                                             for c in ecorr),
                external_unannotated_bound=sum(c.get("unannotated_bound", 0) for c in ecorr),
                external_pending=sum(c.get("pending", 0) for c in ecorr),
                external_rss_mib_per_1000_pods=_max_dicts([memory.by_role(
                    p.result.get("rss_mib_per_1000_pods", {}), (name,)) for p in ext]),
                external_rss_mib_peak=memory.by_role(_max_dicts([p.result.get("hwm_mib_bound", {}) for p in ext]),
                                                     (name,)),
            )
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

    def pct(r: dict[str, Any]) -> str:
        return str(r.get("percentage_of_nodes_to_score") or "default")

    lines = ["Throughput (pods created all at once; pods/s from first create to last bind)"]
    lines += grid(("nodes", "ext", "pct", "ours/s", "plain/s", "ratio", "per pair", "sched algo ms ours/plain",
                   "CPU ms/pod ours/plain", "RT/pod", "overcommit", "unannot+undecodable", "ledger!=annot", "leaks",
                   "pending",
                   "unbound ours/plain", "attempts error ours/plain"),
                  [[str(r["nodes"]), r["replicas"], pct(r), f(r["ours_pods_s"]), f(r["plain_pods_s"]), f(r["ratio"], 2),
                    ", ".join(f(x, 2) for x in r.get("ratio_pairs") or []) or "-",
                    f"{f(r['scheduler_algorithm_ms_ours'])}/{f(r['scheduler_algorithm_ms_plain'])}",
                    f"{f(cpu_total(r['cpu_ms_per_pod_ours']))}/{f(cpu_total(r['cpu_ms_per_pod_plain']))}",
                    f(r["redis_per_pod_extender"], 2),
                    f"{f(r['overcommitted_cards_ledger'])}+{f(r['overcommitted_cards_annotations'])}",
                    f"{f(r['unannotated_bound'])}+{f(r.get('undecodable_records'))}",
                    f(r["ledger_annotation_mismatches"]) + (f" ({r['ledger_unsettled_phases']} unsettled)"
                                                            if r.get("ledger_unsettled_phases") else ""),
                    f(r["leaked_reservations"]), f(r["pending_after_timeout"]),
                    f"{f(r.get('unbound_pods'))}/{f(r.get('unbound_pods_plain'))}",
                    f"{f(r.get('schedule_attempts_error'))}/{f(r.get('schedule_attempts_error_plain'))}"]
                   for r in rows])
    p2_rows = [r for r in rows if r.get("plain2_pods_s") is not None]
    if p2_rows:
        lines += ["", "The baseline of runs before 2026-12-04 beside it (plain2: plain pods without the vgpu twin, two "
                  "extended resources to ours' three)"]
        lines += grid(("nodes", "ext", "pct", "plain/s", "plain2/s", "ratio", "ratio to plain2",
                       "sched algo ms plain/plain2", "CPU ms/pod plain/plain2"),
                      [[str(r["nodes"]), r["replicas"], pct(r), f(r["plain_pods_s"]), f(r["plain2_pods_s"]),
                        f(r["ratio"], 2), f(r["ratio_plain2"], 2),
                        f"{f(r['scheduler_algorithm_ms_plain'])}/{f(r['scheduler_algorithm_ms_plain2'])}",
                        f"{f(cpu_total(r['cpu_ms_per_pod_plain']))}/{f(cpu_total(r['cpu_ms_per_pod_plain2']))}"]
                       for r in p2_rows])
    ext_rows = [r for r in rows if r.get("external")]
    if ext_rows:
        lines += ["", "An extender started outside the bench, same nodes and pods (created already admitted)"]
        lines += grid(("nodes", "pct", "extender", "pods/s", "runs", "/ plain", "/ ours", "sched algo ms",
                       "CPU ms/pod", "overcommit (annotations)", "unannot", "pending"),
                      [[str(r["nodes"]), pct(r), r["external"], f(r["external_pods_s"]),
                        ", ".join(f(x) for x in r["external_pods_s_all"]), f(r["external_ratio"], 2),
                        f(r["external_pods_s"] / r["ours_pods_s"], 2) if r["ours_pods_s"] else "-",
                        f(r["scheduler_algorithm_ms_external"]), f(cpu_total(r["cpu_ms_per_pod_external"])),
                        str(r["external_overcommitted_cards_annotations"]), str(r["external_unannotated_bound"]),
                        str(r["external_pending"])]
                       for r in ext_rows if r["replicas"] == ext_rows[0]["replicas"]])
    lines += ["", "Memory, MiB of RSS (VmRSS) per role: growth per 1000 nodes / per 1000 pods / per 1000 large pods"
              " (annotation KB each), and peak (VmHWM)"]
    body = []
    for r in rows:
        kinds = sorted({k for key in ("rss_mib_per_1000_nodes", "rss_mib_per_1000_pods", "rss_mib_per_1000_large_pods",
                                      "rss_mib_peak") for k in (r.get(key) or {})})
        for k in kinds:
            body.append([str(r["nodes"]), r["replicas"], pct(r), k,
                         *(f((r.get(key) or {}).get(k), 2) for key in ("rss_mib_per_1000_nodes",
                                                                       "rss_mib_per_1000_pods",
                                                                       "rss_mib_per_1000_large_pods")),
                         f(r.get("large_annotation_kb")), f((r.get("rss_mib_peak") or {}).get(k))])
    lines += grid(("nodes", "ext", "pct", "role", "per 1000 nodes", "per 1000 pods", "per 1000 large pods", "KB",
                   "peak"), body)
    lines += ["", "Packing (node policy): nodes/cards holding a slice after each burst, then paced, phase: "
              + "; ".join(f"{r['nodes']} nodes ext {r['replicas']}: " + ", ".join(
                  f"{n}/{c}" for n, c in zip(r["nodes_used"], r["cards_used"], strict=True)) for r in rows)]
    lines += ["", "Latency p50/p99 ms, handler time (filter.compute: the verb's own work; its CPU: the loop thread's "
              "CPU time in it, collections included; what its wall time has beyond that, the thread waited for a "
              "core)"]
    body = []
    for r in rows:
        for label, key in (("burst", "latency_ms"), (f"{f(r.get('paced_rate'), 0)}/s", "latency_paced_ms")):
            lat = r.get(key)
            if lat:
                body.append([str(r["nodes"]), r["replicas"], pct(r), label, f(r["filter_nodes_mean"], 0),
                             pp(lat, "filter"), pp(lat, "filter.compute"), pp(lat, "filter.compute_cpu"),
                             pp(lat, "filter.compute_gc"), pp(lat, "prioritize"), pp(lat, "bind"),
                             pp(lat, "webhook")])
    lines += grid(("nodes", "ext", "pct", "load", "names", "filter", "filter.compute", "its CPU", "its GC",
                   "prioritize", "bind", "webhook"), body)
    if micro:
        lines.append("")
        lines.append("in-process Extender.filter (no HTTP): " + "; ".join(
            f"{m['candidates']} of {m['nodes']} nodes, filterTopK {m.get('filter_top_k', 0)}: "
            f"p50 {m['filter_p50_ms']:.2f} ms, p99 {m['filter_p99_ms']:.2f} ms"
            f" (prioritize p99 {m['prioritize_p99_ms']:.2f} ms; first call per request shape "
            f"{m['filter_cold_mean_ms']:.2f} ms)" for m in micro))
    lines.append("RT/pod = the extender's Redis round trips per bound pod; overcommit = cards over-committed in the "
                 "ledger + recomputed from annotations; unbound = pods refused at create or pending at --timeout "
                 "(any: no ratio); '-' = not checked (no ledger, kube-scheduler's /metrics not read); p99 from "
                 "8 %-wide buckets (the product's coarse buckets with --kubeconfig); pct = kube-scheduler's "
                 "percentageOfNodesToScore (default: its adaptive default)")
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
    if doc.get("aborted"):
        print(f"run stopped by {doc['aborted']}: the summary covers the phases that finished only")
    print(f"results: {path} (and latest.json)", flush=True)
