"""bench/results/throughput.png: throughput and latency against node count, from a load run's JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["summary"]
    # one percentageOfNodesToScore per plot: the first of the run (the others are in the JSON and the table)
    pct = rows[0].get("percentage_of_nodes_to_score", 0) if rows else 0
    rows = [r for r in rows if r.get("percentage_of_nodes_to_score", 0) == pct]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 6))
    replicas = sorted({r["replicas"] for r in rows})
    plain: dict[int, list[float]] = {}
    for r in rows:
        plain.setdefault(r["nodes"], []).extend(r["plain_pods_s_all"])
    xs = sorted(plain)
    if any(plain[x] for x in xs):
        ys = [sum(plain[x]) / len(plain[x]) if plain[x] else float("nan") for x in xs]
        ax1.plot(xs, ys, "s--", color="grey", label="plain kube-scheduler, no extender (mean of its runs)")
        ax1.plot(xs, [0.7 * y for y in ys], ":", color="grey", linewidth=1, label="target: 0.7 x plain")
    for i, rep in enumerate(replicas):
        sel = sorted((r for r in rows if r["replicas"] == rep), key=lambda r: r["nodes"])
        sel = [r for r in sel if r["ours_pods_s"] is not None]
        ax1.plot([r["nodes"] for r in sel], [r["ours_pods_s"] for r in sel], "o-", color=f"C{i}",
                 label=f"mtsched, {rep} extender replica{'s' if str(rep) != '1' else ''}")
        for r in sel:
            ax1.annotate(f"{r['ours_pods_s']:.0f}", (r["nodes"], r["ours_pods_s"]), textcoords="offset points",
                         xytext=(6, -12), fontsize=8, color=f"C{i}")
    ext = sorted((r for r in rows if r.get("external") and r["replicas"] == rows[0]["replicas"]),
                 key=lambda r: r["nodes"])
    if ext:
        ax1.plot([r["nodes"] for r in ext], [r["external_pods_s"] for r in ext], "^-.", color="C5",
                 label=f"{ext[0]['external']} (an extender started outside the bench)")
    for x in xs:
        if plain[x]:
            v = sum(plain[x]) / len(plain[x])
            ax1.annotate(f"{v:.0f}", (x, v), textcoords="offset points", xytext=(6, 4), fontsize=8, color="grey")
    ax1.set_xlabel("nodes (8 cards each)")
    ax1.set_ylabel("pods/s (first create to last bind)")
    ax1.set_title(f"End-to-end throughput, {doc['config']['pods']} pods per run, "
                  f"percentageOfNodesToScore {pct or 'default'}")
    ax1.set_ylim(bottom=0)
    ax1.set_xticks(xs or [0])
    ax1.grid(alpha=0.3)
    ax1.margins(x=0.12)
    ax1.legend(fontsize=8, loc="upper right")

    first = min(replicas, key=lambda r: (len(str(r)), str(r))) if replicas else None
    sel = sorted((r for r in rows if r["replicas"] == first), key=lambda r: r["nodes"])
    nodes = [r["nodes"] for r in sel]
    verbs = (("filter", "C0"), ("prioritize", "C2"), ("bind", "C3"), ("webhook", "C4"))
    paced = [float(r["paced_rate"]) for r in sel if r.get("latency_paced_ms")]
    for verb, color in verbs:
        if paced:
            p99 = [(r.get("latency_paced_ms") or {}).get(verb, {}).get("p99_ms") for r in sel]
            ax2.plot(nodes, [float("nan") if y is None else y for y in p99], "o-", color=color,
                     label=f"{verb} p99 at {paced[0]:g} pods/s")
        burst = [r["latency_ms"][verb]["p99_ms"] if r.get("latency_ms") else None for r in sel]
        ax2.plot(nodes, [float("nan") if y is None else y for y in burst], "x--", color=color, alpha=0.55,
                 label=f"{verb} p99, all at once")
    for y, text in ((5, "5 ms target (filter)"), (50, "50 ms target (bind at 50 pods/s)")):
        ax2.axhline(y, color="red", linewidth=0.8, linestyle=":")
        ax2.annotate(text, (nodes[0] if nodes else 0, y), textcoords="offset points", xytext=(2, 3), fontsize=7,
                     color="red")
    ax2.set_yscale("log")
    ax2.set_xlabel("nodes (8 cards each)")
    ax2.set_ylabel("handler latency p99, ms (log)")
    ax2.set_title(f"Extender and webhook latency ({first} extender replica{'s' if str(first) != '1' else ''})")
    ax2.set_xticks(nodes or [0])
    ax2.margins(x=0.12)
    ax2.grid(alpha=0.3, which="both")
    ax2.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.13))
    load = doc["machine"].get("load_avg", [0])[0]
    fig.suptitle(f"mtsched load benchmark {doc['run_id']}: {doc['machine']['cpus']} CPUs, "
                 f"{doc['machine']['memory_gib']} GiB, load {load:.1f} at start", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    import json
    import sys

    src = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "results" / "latest.json"
    plot(json.loads(src.read_text()), src.parent / "throughput.png")
