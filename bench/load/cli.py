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
* plain: the same pods as kube-scheduler sees them after admission, without mthreads.com/vgpu
  (same sgpu-memory/sgpu-core, node-level extended resources), labeled so the webhook ignores
  them, placed by the `default-scheduler` profile with no extender call.

then one more run of ours at a steady rate (--paced-rate, default 50 pods/s), for latency at a
load the machine sustains.

Each phase measures pods/s from the first create to the last bind (bind times from a watch),
extender and webhook latency (the roles' /metrics before/after; fine buckets in local mode, see
bench/timed_role.py), kube-scheduler's algorithm time per pod, CPU time per process (local mode),
Redis round trips per pod, and correctness: over-committed cards (ledger and recomputed from the
pods' annotations), pods bound without annotations, reservations leaked after every pod is
deleted. Results: bench/results/<run>.json, latest.json, throughput.png. docs/benchmarks.md
explains the figures.

  python -m bench.load                  # 500 and 1000 nodes, 2000 pods, 1 and 3 replicas (~22 min)
  python -m bench.load --nodes 50 --pods 200 --replicas 1 --repeat 1 --paced-pods 200   # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.load.cluster import LedgerView, Local, Target, delete_nodes, ensure_nodes, machine
from bench.load.phase import Phase, run_phase
from bench.load.report import save, summarize
from bench.workload import shapes
from shared.serving.logs import Progress

RESULTS = Path(__file__).resolve().parent.parent / "results"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, nargs="+", default=[500, 1000], help="node counts (default 500 1000)")
    p.add_argument("--pods", type=int, default=2000, help="pods per phase (default 2000)")
    p.add_argument("--rate", type=float, default=0.0, help="create pods at this rate (pods/s); default all at once")
    p.add_argument("--concurrency", type=int, default=32, help="creates in flight when all at once (default 32)")
    p.add_argument("--replicas", type=int, nargs="+", default=[1, 3], help="extender replicas (local; default 1 3)")
    p.add_argument("--webhooks", type=int, default=1, help="webhook replicas (local; default 1)")
    p.add_argument("--paced-rate", type=float, default=50.0,
                   help="then one more run of ours at this steady rate, for latency (pods/s; 0: skip; default 50)")
    p.add_argument("--paced-pods", type=int, default=1000, help="pods of the paced run (default 1000)")
    p.add_argument("--repeat", type=int, default=2, help="ours/plain pairs per setting, order alternating (default 2)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds a phase may take to bind (default 300)")
    p.add_argument("--no-plain", action="store_true", help="skip the plain kube-scheduler phases")
    p.add_argument("--micro-iterations", type=int, default=1000,
                   help="in-process filter calls per node count (0: skip)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--extender-http", action="store_true",
                   help="local: kube-scheduler calls the extender over plain HTTP (sidecar topology, 1 replica)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="local: a setting for our roles, e.g. --set eventsEnabled=false (repeatable)")
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
    args = p.parse_args(argv)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {}
    try:
        asyncio.run(amain(args, doc))
    finally:
        if doc.get("run_id"):
            save(doc, out_dir)
    bad = [r for r in doc.get("summary", []) if r["overcommitted_cards_ledger"]
           or r["overcommitted_cards_annotations"] or r["unannotated_bound"] or r["leaked_reservations"]]
    return 1 if bad else 0


async def amain(args: argparse.Namespace, doc: dict[str, Any]) -> None:
    from bench import micro
    from controller.kube import Kube

    say = Progress()
    started = datetime.now(UTC)
    run_id = started.strftime("%Y%m%d-%H%M%S")
    doc.update({"run_id": run_id, "started": started.isoformat(), "command": " ".join(sys.argv),
                           "machine": machine(), "config": {k: v for k, v in vars(args).items()},
                           "micro": [], "phases": [], "summary": []})
    say(f"machine: {doc['machine']['cpus']} cpus, {doc['machine']['memory_gib']} GiB, load average "
        f"{' '.join(f'{x:.2f}' for x in doc['machine']['load_avg'])}")
    mix = shapes(args.pods, args.seed)
    doc["config"]["mix"] = dict(Counter(s.kind for s in mix))
    if args.micro_iterations:
        for n in sorted(set(args.nodes)):
            r = micro.run(n, min(500, n), args.micro_iterations)
            doc["micro"].append(r)
            say(f"in-process filter, {r['candidates']} of {n} nodes: p50 {r['filter_p50_ms']:.2f} ms, "
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
        kube = await Kube.create(kubeconfig)
        try:
            for n in args.nodes:
                names = await ensure_nodes(kube, n, args.kwok, say)
                for replicas, fixed in targets:
                    target = fixed or (local.target(int(replicas), args.webhooks, args.extender_http,
                                                    dict(x.split("=", 1) for x in args.set)) if local else None)
                    assert target is not None
                    ledger = LedgerView(target.redis_url, target.key_prefix) if target.redis_url else None
                    try:
                        if ledger is not None:
                            ok, _ = await ledger.wait(names, lambda s, n=n: len(s) >= n, 120)  # type: ignore[misc]
                            say(f"ledger holds the {n} nodes" if ok else "ledger did not get every node in 120s")
                        await asyncio.sleep(2.0)  # kube-scheduler's informer sees the nodes
                        for rep in range(args.repeat):
                            order = ["ours", "plain"] if rep % 2 == 0 else ["plain", "ours"]
                            for mode in order:
                                if mode == "plain" and args.no_plain:
                                    continue
                                ph = Phase(mode, n, replicas, rep, rate=args.rate)
                                await run_phase(kube, target, ledger, names, mix, ph, args, say)
                                phases.append(ph)
                                doc["phases"].append(ph.result)
                        if args.paced_rate and args.paced_pods:
                            ph = Phase("paced", n, replicas, 0, rate=args.paced_rate)
                            await run_phase(kube, target, ledger, names, mix[:args.paced_pods], ph, args, say)
                            phases.append(ph)
                            doc["phases"].append(ph.result)
                    finally:
                        if ledger is not None:
                            await ledger.close()
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
        doc["summary"] = summarize(phases, fine=local is not None)
