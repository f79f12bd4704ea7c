"""`python -m bench.load`: end-to-end load benchmark of mtsched against plain kube-scheduler.

A load tool, not a test. By default it starts everything itself on this machine: a real etcd +
kube-apiserver + kube-scheduler (deploy/local), a Redis, and our roles as processes over HTTPS
(with a random balancer in front of several extender replicas). With --kubeconfig it runs against
an existing cluster where mtsched is installed (e.g. kind + the Helm chart, docs/benchmarks.md).

For every node count (--nodes) it creates that many simulated nodes through the API (8 cards each,
half MTT S4000, half S5000); for every extender replica count (--replicas) and repetition it runs
two phases on the same nodes, in alternating order:

* ours: --pods pods (slices, exclusive cards, two-card pods) created through the admission webhook
  and placed by kube-scheduler's `hami-scheduler` profile calling our extender (filter, prioritize,
  bind);
* plain: the same pods as kube-scheduler sees them after admission, their three extended resources
  (vgpu, sgpu-memory, sgpu-core) asked as node-level twins our roles do not read, labeled so the
  webhook ignores them, placed by the `default-scheduler` profile with no extender call
  (--also-plain2: also the baseline before 2026-12-04, without the vgpu twin).

then one more run of ours at a steady rate (--paced-rate, default 50 pods/s), for latency at a
load the machine sustains, and one of ours with large pods (--large-pods, each carrying a
--large-annotation-kb annotation), for what the pods cost in memory. With --external-extender, an
extender started outside the benchmark is timed on the same nodes and pods (created already in their
admitted form), kube-scheduler calling it; --percentage-of-nodes-to-score repeats everything for each
value of kube-scheduler's percentageOfNodesToScore.

Each phase measures pods/s from the first create to the last bind (bind times from a watch),
extender and webhook latency (the roles' /metrics before/after; fine buckets in local mode, see
bench/timed_role.py), kube-scheduler's algorithm time per pod, CPU time per process (local mode),
Redis round trips per pod, RSS of each role (VmRSS/VmHWM, growth per 1,000 nodes and pods), and
correctness: over-committed cards (ledger and recomputed from the
pods' annotations), pods bound without annotations, reservations leaked after every pod is
deleted. Results: bench/results/<run>.json, latest.json, throughput.png. docs/benchmarks.md
explains the figures.

  python -m bench.load                  # 500 and 1000 nodes, 2000 pods, 1 and 3 replicas (~22 min)
  python -m bench.load --nodes 50 --pods 200 --replicas 1 --repeat 1 --paced-pods 200   # a quick look
  python -m bench.load --nodes 5000 --replicas 1 --percentage-of-nodes-to-score 0 100   # on demand, slow
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import sys
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.load import external, memory
from bench.load.cluster import LedgerView, Local, Target, delete_nodes, ensure_nodes, machine
from bench.load.phase import Phase, run_phase
from bench.load.report import save, summarize
from bench.stack import EXTENDER_TLS, concrete
from bench.workload import Shape, shapes
from shared.serving.logs import Progress

# What deploy/helm/hami/values.yaml sets that the library's defaults (shared/config.py) do not: the benchmark
# measures what the chart deploys unless told otherwise (--set).
CHART_SETTINGS = {"filterTopK": "1"}

RESULTS = Path(__file__).resolve().parent.parent / "results"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, nargs="+", default=[500, 1000],
                   help="node counts (default 500 1000; 5000 on demand: slow, each role then carries 40,000 cards)")
    p.add_argument("--node-concurrency", type=int, default=32, help="node creates in flight (default 32)")
    p.add_argument("--percentage-of-nodes-to-score", type=int, nargs="+", default=[0], metavar="N",
                   help="local: kube-scheduler's percentageOfNodesToScore, globally and in every profile; every "
                        "value is one more pass over the plan (0: kube-scheduler's adaptive default; default 0)")
    p.add_argument("--pods", type=int, default=2000, help="pods per phase (default 2000)")
    p.add_argument("--rate", type=float, default=0.0, help="create pods at this rate (pods/s); default all at once")
    p.add_argument("--concurrency", type=int, default=32, help="creates in flight when all at once (default 32)")
    p.add_argument("--replicas", type=int, nargs="+", default=[1, 3], help="extender replicas (local; default 1 3)")
    p.add_argument("--webhooks", type=int, default=1, help="webhook replicas (local; default 1)")
    p.add_argument("--paced-rate", type=float, default=50.0,
                   help="then one more run of ours at this steady rate, for latency (pods/s; 0: skip; default 50)")
    p.add_argument("--paced-pods", type=int, default=1000, help="pods of the paced run (default 1000)")
    p.add_argument("--large-pods", type=int, default=1000,
                   help="then one more run of ours with that many large pods (at most --pods), all at once "
                        "(0: skip; default 1000)")
    p.add_argument("--large-annotation-kb", type=int, default=50,
                   help="the large pods' annotation, KB per pod (default 50)")
    p.add_argument("--repeat", type=int, default=2,
                   help="ours/plain pairs (--also-plain2: ours/plain/plain2) per setting, order mirrored (default 2)")
    p.add_argument("--warmup-pods", type=int, default=100,
                   help="before the measured phases of each setting, this many pods through ours and then plain, "
                        "not measured: kube-scheduler and our roles were just (re)started, and the first burst "
                        "after a start pays their warm-up, which fell on ours alone (0: none; default 100)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds a phase may take to bind (default 300)")
    p.add_argument("--no-plain", action="store_true", help="skip the plain kube-scheduler phases")
    p.add_argument("--also-plain2", action="store_true",
                   help="beside each plain phase, one more with the baseline of runs before 2026-12-04: plain pods "
                        "without the vgpu twin, two extended resources to ours' three (bench/workload.py "
                        "PLAIN_VGPU); reported as plain2 beside plain")
    p.add_argument("--micro-iterations", type=int, default=1000,
                   help="in-process filter calls per node count (0: skip)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--extender-tls", choices=EXTENDER_TLS, default="chart",
                   help="local, one extender replica: how kube-scheduler calls it. chart (default): as the chart "
                        "deploys it by default, today http; http: plain HTTP on loopback (the chart's sidecar on its "
                        "pod's loopback); https: the chart with scheduler.extender.scheme=https, HTTPS without a "
                        "client certificate (the default before 2026-12-03 19:10 UTC); mutual: the harness's mutual "
                        "TLS (kube-scheduler's client certificate) (bench/stack.py)")
    p.add_argument("--extender-http", dest="extender_tls", action="store_const", const="http",
                   help="the same as --extender-tls http")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="local: a setting for our roles, e.g. --set eventsEnabled=false (repeatable); the chart's "
                        f"values are the defaults ({', '.join(f'{k}={v}' for k, v in CHART_SETTINGS.items())})")
    p.add_argument("--kubeconfig", help="run against this cluster (mtsched installed) instead of a local one")
    p.add_argument("--metrics", action="append", default=[], metavar="ROLE=URL",
                   help="with --kubeconfig: a role's /metrics URL (extender|webhook|watcher), repeatable")
    p.add_argument("--redis-url", default="",
                   help="with --kubeconfig: the ledger's Redis (for over-commit/leak checks)")
    p.add_argument("--key-prefix", default="mt")
    p.add_argument("--kwok", action="store_true", help="create KWOK-managed nodes (annotation + taint, pods tolerate)")
    p.add_argument("--keep-nodes", action="store_true", help="do not delete the simulated nodes at the end")
    p.add_argument("--scheduler-verbosity", type=int, default=2, help="local kube-scheduler --v (default 2)")
    p.add_argument("--out", default=str(RESULTS), help="results directory (default bench/results)")
    external.add_options(p)
    args = p.parse_args(argv)
    ext = external.from_args(args)
    for pct in args.percentage_of_nodes_to_score:
        if not 0 <= pct <= 100:
            p.error(f"--percentage-of-nodes-to-score: got {pct}; allowed: 0 (kube-scheduler's default) to 100")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {}
    try:
        asyncio.run(amain(args, doc, ext))
    except BaseException as e:  # the results say the run did not finish: its summary covers the finished phases only
        doc["aborted"] = f"{type(e).__name__}: {e}"[:500]
        raise
    finally:
        if doc.get("run_id"):
            save(doc, out_dir)
    return 1 if failed(doc.get("summary", [])) else 0


def failed(rows: list[dict[str, Any]]) -> bool:
    """The run's verdict (its exit code): a correctness counter above 0, or a measured phase, ours or plain,
    that did not bind every pod it was given (its pods/s, and any ratio from it, describe other work)."""
    return any(r["overcommitted_cards_ledger"] or r["overcommitted_cards_annotations"] or r["unannotated_bound"]
               or r.get("undecodable_records") or r.get("ledger_annotation_mismatches") or r["leaked_reservations"]
               or r.get("ledger_unsettled_phases")
               or r.get("unbound_pods") or r.get("unbound_pods_plain") for r in rows)


def run_config(args: argparse.Namespace) -> dict[str, Any]:
    """The options as given, and `extender_tls_mode`: the mode `--extender-tls` measured with one extender replica
    (`chart` meant https before 2026-12-03 19:10 UTC, `4c2a096`, and means http since; several replicas: mutual
    TLS, the balancer)."""
    return {**vars(args), "extender_tls_mode": concrete(args.extender_tls)}


async def amain(args: argparse.Namespace, doc: dict[str, Any], ext: external.External | None = None) -> None:
    from bench import micro
    from shared.kube import Kube

    say = Progress()
    started = datetime.now(UTC)
    run_id = started.strftime("%Y%m%d-%H%M%S")
    doc.update({"run_id": run_id, "started": started.isoformat(), "command": " ".join(sys.argv),
                           "machine": machine(), "config": run_config(args),
                           "micro": [], "phases": [], "warmups": [], "node_memory": [], "summary": []})
    say(f"machine: {doc['machine']['cpus']} cpus, {doc['machine']['memory_gib']} GiB, load average "
        f"{' '.join(f'{x:.2f}' for x in doc['machine']['load_avg'])}")
    mix = workload(args)
    doc["config"]["mix"] = dict(Counter(s.kind for s in mix[:args.pods]))
    if args.micro_iterations:
        for n, top in itertools.product(sorted(set(args.nodes)), (0, 1)):  # every feasible node; the chart's k
            r = micro.run(n, min(500, n), args.micro_iterations, top_k=top)
            doc["micro"].append(r)
            say(f"in-process filter (filterTopK {top}), {r['candidates']} of {n} nodes: "
                f"p50 {r['filter_p50_ms']:.2f} ms, "
                f"p99 {r['filter_p99_ms']:.2f} ms; prioritize p99 {r['prioritize_p99_ms']:.2f} ms; first call of "
                f"each of {r['cold_shapes']} request shapes {r['filter_cold_mean_ms']:.2f} ms mean")
    local: Local | None = None
    phases: list[Phase] = []
    try:
        if args.kubeconfig:
            metrics: dict[str, list[str]] = defaultdict(list)
            for item in args.metrics:
                role, _, url = item.partition("=")
                metrics[role].append(url)
            targets: list[tuple[int | str, Target | None]] = [
                ("installed", Target(args.kubeconfig, dict(metrics), args.redis_url, args.key_prefix))]
            kubeconfig = args.kubeconfig
        else:
            local = Local(say, args.scheduler_verbosity)
            local.start()
            targets = [(r, None) for r in args.replicas]
            kubeconfig = str(local.cp.kubeconfig_path)
        if local is not None and args.publish_kubeconfig:
            publish = Path(args.publish_kubeconfig)
            await asyncio.to_thread(publish.write_bytes, local.cp.kubeconfig_path.read_bytes())
            say(f"kubeconfig of the local control plane published at {args.publish_kubeconfig}")
        kube = await Kube.create(kubeconfig)
        try:
            for n in args.nodes:
                names: list[str] = []
                for pct in args.percentage_of_nodes_to_score:
                    for replicas, fixed in targets:
                        if local is not None:
                            local.percentage = pct
                        elif pct:
                            say("--percentage-of-nodes-to-score applies to the local control plane only")
                        target = fixed or (local.target(int(replicas), args.webhooks, args.extender_tls,
                                                        role_settings(args.set)) if local else None)
                        assert target is not None
                        mem_start = memory.sample(target.pids)
                        created = 0
                        if not names:
                            names, created = await ensure_nodes(kube, n, args.kwok, say, args.node_concurrency)
                        ledger = LedgerView(target.redis_url, target.key_prefix) if target.redis_url else None
                        try:
                            if ledger is not None:
                                wait = max(120.0, n / 20)
                                ok, _ = await ledger.wait(names, lambda s, n=n: len(s) >= n, wait)  # type: ignore[misc]
                                say(f"ledger holds the {n} nodes" if ok
                                    else f"ledger did not get every node in {wait:g}s")
                            await asyncio.sleep(2.0)  # kube-scheduler's informer sees the nodes
                            if created:
                                rec = node_memory(n, replicas, pct, created, mem_start, memory.sample(target.pids))
                                doc["node_memory"].append(rec)
                                say(f"RSS MiB per 1000 nodes ({created} created): " + ", ".join(
                                    f"{k} {v}" for k, v in memory.by_role(rec["rss_mib_per_1000_nodes"]).items()))
                            for ph in warmup(n, replicas, pct, args):  # kept apart: never summarized
                                await run_phase(kube, target, ledger, names, mix[:args.warmup_pods], ph, args, say)
                                doc["warmups"].append(ph.result)
                            for ph, pods in plan(n, replicas, pct, args, args.pods):
                                await run_phase(kube, target, ledger, names, mix[:pods], ph, args, say)
                                phases.append(ph)
                                doc["phases"].append(ph.result)
                        finally:
                            if ledger is not None:
                                await ledger.close()
                    if ext is not None and local is not None:
                        target = local.external_target(ext)
                        if not await asyncio.to_thread(external.wait_until_answers, ext, local.cp.pki.ca_crt, say):
                            say(f"{ext.name} at {ext.url} did not answer in {ext.wait_seconds:g}s: its phases skipped")
                            continue
                        await asyncio.sleep(2.0)
                        for ph in external_warmup(n, ext.name, pct, args):  # kept apart: never summarized
                            await run_phase(kube, target, None, names, mix[:args.warmup_pods], ph, args, say)
                            doc["warmups"].append(ph.result)
                        for rep in range(args.repeat):
                            ph = Phase("external", n, ext.name, rep, percentage=pct)
                            await run_phase(kube, target, None, names, mix[:args.pods], ph, args, say)
                            phases.append(ph)
                            doc["phases"].append(ph.result)
            if not args.keep_nodes:
                await delete_nodes(kube)
        finally:
            await kube.close()
    finally:
        if local is not None:
            say("stopping the local control plane, Redis and our roles")
            local.stop()
        doc["machine"]["load_avg_end"] = os.getloadavg()
        doc["finished"] = datetime.now(UTC).isoformat()
        doc["summary"] = summarize(phases, fine=local is not None, node_memory=doc["node_memory"])


def workload(args: argparse.Namespace) -> list[Shape]:
    """The pods of every phase, fixed seed: the bursts take the first --pods, the paced run the first
    --paced-pods, a warm-up the first --warmup-pods. One sequence, long enough for the largest (a mix of
    --pods alone cut the paced run and the warm-up down to --pods, whatever they asked for)."""
    return shapes(max(args.pods, args.paced_pods if args.paced_rate else 0, args.warmup_pods), args.seed)


def role_settings(given: list[str]) -> dict[str, str]:
    """Our roles' settings: the chart's where it differs from the library's defaults, then each --set."""
    return {**CHART_SETTINGS, **dict(x.split("=", 1) for x in given)}


def warmup(n: int, replicas: int | str, pct: int, args: argparse.Namespace) -> list[Phase]:
    """Unmeasured phases before a setting's measured ones (rep -1): ours, then plain, --warmup-pods each. Each
    setting restarts kube-scheduler (its percentage) and our roles; without them the first measured phase,
    always ours with --repeat 1, paid every process's first burst (kube-scheduler 5.6 against plain's 4.0 ms
    per pod and the API server 9.6 against 6.8 at 500 nodes in run-20261203-223834)."""
    if args.warmup_pods <= 0:
        return []
    return [Phase(mode, n, replicas, -1, percentage=pct) for mode in ("ours", "plain")
            if not (mode == "plain" and args.no_plain)]


def external_warmup(n: int, name: str, pct: int, args: argparse.Namespace) -> list[Phase]:
    """An unmeasured phase (rep -1, --warmup-pods) before an external extender's measured ones: it too pays its
    first burst (connections, caches, a JIT or a garbage collector warming up) on whatever phase comes first,
    and ours had a warm-up of their own before theirs."""
    return [Phase("external", n, name, -1, percentage=pct)] if args.warmup_pods > 0 else []


def plan(n: int, replicas: int | str, pct: int, args: argparse.Namespace, pods: int) -> list[tuple[Phase, int]]:
    """The phases of one setting, in order, with their pod counts: ours/plain pairs (order alternating),
    paced, large."""
    out: list[tuple[Phase, int]] = []
    for rep in range(args.repeat):
        # mirrored (ABC, CBA): over an even --repeat every mode has the same mean position, plain2 included
        for mode in (["ours", "plain", "plain2"] if rep % 2 == 0 else ["plain2", "plain", "ours"]):
            if (mode.startswith("plain") and args.no_plain) or (mode == "plain2" and not args.also_plain2):
                continue
            out.append((Phase(mode, n, replicas, rep, rate=args.rate, percentage=pct), pods))
    if args.paced_rate and args.paced_pods:
        out.append((Phase("paced", n, replicas, 0, rate=args.paced_rate, percentage=pct), args.paced_pods))
    if args.large_pods:
        out.append((Phase("large", n, replicas, 0, percentage=pct, large_kb=args.large_annotation_kb),
                     min(args.large_pods, pods)))  # the first pods of the mix, as paced
    return out


def node_memory(n: int, replicas: int | str, pct: int, created: int, before: memory.Sample,
                after: memory.Sample) -> dict[str, Any]:
    return {"nodes": n, "replicas": replicas, "percentage": pct, "created": created,
            "rss_mib_start": memory.mib(before), "rss_mib_nodes": memory.mib(after),
            "hwm_mib_nodes": memory.mib(after, "hwm_kib"),
            "rss_mib_per_1000_nodes": memory.growth_per_1000(before, after, created)}
