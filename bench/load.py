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
import contextlib
import json
import os
import platform
import statistics
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import prom
from bench.workload import CHART_IGNORE_LABEL, IGNORE_LABEL, RUN_LABEL, Shape, our_pod, plain_pod, shapes
from controller.logs import Progress
from shared.config import redact_url

RESULTS = Path(__file__).resolve().parent / "results"
NODE_LABEL = "mtsched.io/bench-node"
NODE_PREFIX = "bench-node-"
WHOLE_CARD_MEMORY = 160  # the webhook gives exclusive/multi pods the largest reported model: S5000
CARDS_PER_NODE = 8
KWOK_ANNOTATION = "kwok.x-k8s.io/node"


def machine() -> dict[str, Any]:
    mem_kib = 0
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    return {"cpus": os.cpu_count(), "memory_gib": round(mem_kib / 2**20, 1), "load_avg": os.getloadavg(),
            "python": platform.python_version(), "platform": platform.platform()}


# -- the cluster under test ----------------------------------------------------------------------

@dataclass
class Target:
    """Where pods go and where the roles' /metrics are read."""

    kubeconfig: str
    metrics: dict[str, list[str]] = field(default_factory=dict)  # extender|webhook|watcher -> URLs
    redis_url: str = ""
    key_prefix: str = "mt"
    fine: bool = False  # roles run through bench.timed_role (fine latency buckets)
    replicas: int | str = "installed"
    pids: dict[str, int] = field(default_factory=dict)  # local processes, for CPU time per component
    scheduler_metrics: tuple[str, str] | None = None  # (URL, bearer token) of kube-scheduler's /metrics


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """utime + stime of each process (and of this one, as "bench-client"), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for name, pid in pids.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[name] = (int(fields[11]) + int(fields[12])) / tick
    t = os.times()
    out["bench-client"] = t.user + t.system
    return out


class Local:
    """ControlPlane + Redis + our roles (through bench.timed_role) on this machine."""

    def __init__(self, say: Progress, scheduler_verbosity: int):
        from deploy.local.controlplane import ControlPlane, ensure_binaries
        from deploy.local.redis import RedisServer, new_password

        say("control-plane binaries (built once from the pinned Go modules, then cached)")
        self.cp = ControlPlane(bin_dir=ensure_binaries(progress=sys.stderr), scheduler_verbosity=scheduler_verbosity)
        self.redis = RedisServer(password=new_password())
        self.stack: Any = None
        self.say = say

    def start(self) -> None:
        self.cp.start()
        self.say(f"kube-apiserver up at {self.cp.server_url}")
        self.redis.start()
        self.say(f"redis-server up at {redact_url(self.redis.url)}")

    def target(self, replicas: int, webhooks: int, extender_http: bool = False,
               settings: dict[str, str] | None = None) -> Target:
        """(Re)start our roles with `replicas` extenders; kube-scheduler is restarted to call them."""
        from bench.stack import BenchStack

        if self.stack is not None:
            self.stack.stop()
        self.stack = BenchStack(self.cp, self.redis.url, "96,160", extenders=replicas, webhooks=webhooks,
                                watchers=1, settings=dict(settings or {}), extender_http=extender_http).start()
        urls: dict[str, list[str]] = defaultdict(list)
        for role in self.stack.roles:
            urls[role.kind].append(f"http://127.0.0.1:{role.metrics_port}/metrics")
        self.say(f"mtsched up: {replicas} extender(s){' behind the random balancer' if replicas > 1 else ''}, "
                 f"{webhooks} webhook(s), 1 watcher; kube-scheduler restarted with the extender"
                 f"{' over plain HTTP (sidecar topology)' if extender_http else ' over HTTPS'}")
        pids = {name: proc.popen.pid for name, proc in self.cp._procs.items()}
        if self.redis.proc is not None:
            pids["redis"] = self.redis.proc.pid
        for role in self.stack.roles:
            if role.proc is not None:
                pids[role.name] = role.proc.pid
        for kind, (proc, _) in self.stack.balancers.items():
            pids[f"balancer-{kind}"] = proc.pid
        sched = (f"https://127.0.0.1:{self.cp._sched_port}/metrics", self.cp.token)
        return Target(str(self.cp.kubeconfig_path), dict(urls), self.redis.url, fine=True, replicas=replicas,
                      pids=pids, scheduler_metrics=sched)

    def stop(self) -> None:
        if self.stack is not None:
            with contextlib.suppress(Exception):
                self.stack.stop()
        self.redis.cleanup()
        self.cp.stop()


# -- API helpers -----------------------------------------------------------------------------------

async def list_all(kube: Any, path: str, **query: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cont = ""
    while True:
        q: dict[str, Any] = {"limit": 500, **query}
        if cont:
            q["continue"] = cont
        page = await kube.request("GET", path, query=q)
        items.extend(page.get("items") or [])
        cont = (page.get("metadata") or {}).get("continue") or ""
        if not cont:
            return items


async def gather_limited(n: int, coros: Sequence[Callable[[], Any]]) -> list[Any]:
    sem = asyncio.Semaphore(n)

    async def one(c: Callable[[], Any]) -> Any:
        async with sem:
            return await c()

    return list(await asyncio.gather(*(one(c) for c in coros)))


def node_model(name: str) -> int:
    return 96 if int(name.rsplit("-", 1)[1]) % 2 == 0 else 160


async def ensure_nodes(kube: Any, count: int, kwok: bool, say: Progress) -> list[str]:
    from deploy.local import nodes as simulated

    existing = {n["metadata"]["name"] for n in await list_all(kube, "/api/v1/nodes", labelSelector=NODE_LABEL)}
    want = [f"{NODE_PREFIX}{i:05d}" for i in range(count)]
    todo = [n for n in want if n not in existing]

    def make(name: str) -> dict[str, Any]:
        body = (simulated.s4000_node if node_model(name) == 96 else simulated.s5000_node)(
            name, sliced_cards=CARDS_PER_NODE, labels={NODE_LABEL: "true"})
        if kwok:
            body["metadata"]["annotations"] = {KWOK_ANNOTATION: "fake"}
            body["metadata"]["labels"]["type"] = "kwok"
            body["spec"]["taints"] = [{"key": KWOK_ANNOTATION, "value": "fake", "effect": "NoSchedule"}]
        return body

    t = time.monotonic()
    await gather_limited(32, [lambda n=n: kube.request("POST", "/api/v1/nodes", make(n)) for n in todo])  # type: ignore[misc]
    extra = sorted(existing - set(want))
    await gather_limited(32, [lambda n=n: kube.request("DELETE", f"/api/v1/nodes/{n}", ok=(200, 202, 404))  # type: ignore[misc]
                              for n in extra])
    say(f"nodes: {count} ({count // 2} S4000 + {count - count // 2} S5000, {CARDS_PER_NODE} cards each): "
        f"created {len(todo)}, removed {len(extra)} in {time.monotonic() - t:.1f}s")
    return want


async def delete_nodes(kube: Any) -> None:
    names = [n["metadata"]["name"] for n in await list_all(kube, "/api/v1/nodes", labelSelector=NODE_LABEL)]
    await gather_limited(32, [lambda n=n: kube.request("DELETE", f"/api/v1/nodes/{n}", ok=(200, 202, 404))  # type: ignore[misc]
                              for n in names])


# -- the ledger (when Redis is reachable) -----------------------------------------------------------

class LedgerView:
    def __init__(self, redis_url: str, prefix: str):
        from shared.ledger import Ledger, connect

        self.client = connect(redis_url)
        self.ledger = Ledger(self.client, prefix)

    async def snapshots(self, nodes: Sequence[str]) -> dict[str, Any]:
        return await self.ledger.snapshots(nodes)

    async def wait(self, nodes: Sequence[str], ok: Callable[[dict[str, Any]], bool],
                   timeout: float) -> tuple[bool, dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            snaps = await self.snapshots(nodes)
            if ok(snaps) or time.monotonic() > deadline:
                return ok(snaps), snaps
            await asyncio.sleep(0.5)

    async def close(self) -> None:
        await self.client.aclose()


# -- one phase ------------------------------------------------------------------------------------

def scrape_all(target: Target) -> dict[str, prom.Scrape]:
    out: dict[str, prom.Scrape] = {}
    for kind, urls in target.metrics.items():
        parts = []
        for u in urls:
            try:
                parts.append(prom.scrape(u))
            except OSError as e:
                print(f"  (could not scrape {u}: {e})", flush=True)
        out[kind] = prom.merge(parts)
    if target.scheduler_metrics:
        try:
            out["kube-scheduler"] = prom.scrape(target.scheduler_metrics[0], token=target.scheduler_metrics[1])
        except OSError as e:
            print(f"  (could not scrape kube-scheduler: {e})", flush=True)
    return out


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
        for part in ("filter.compute", "prioritize.compute", "bind.ledger_place", "bind.api_binding",
                     "bind.ledger_mark_bound", "bind.api_get_pod", "webhook.compute", "extender.loop_lag",
                     "webhook.loop_lag"):
            src = hook if part.startswith("webhook") else ext
            verb = "loop_lag" if part.endswith("loop_lag") else part
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


@dataclass
class Phase:
    mode: str  # ours | plain | paced (ours, created at a steady rate, for latency)
    nodes: int
    replicas: int | str
    rep: int
    rate: float = 0.0  # pods/s; 0: all at once
    result: dict[str, Any] = field(default_factory=dict)
    diff: dict[str, prom.Scrape] = field(default_factory=dict)


async def run_phase(kube: Any, target: Target, ledger: LedgerView | None, node_names: list[str], mix: list[Shape],
                    ph: Phase, args: argparse.Namespace, say: Progress) -> None:
    from controller.reflector import Reflector

    run = uuid.uuid4().hex[:6]
    ns = f"bench-{ph.mode}-{run}"
    ns_labels = {RUN_LABEL: run}
    if ph.mode == "plain":
        ns_labels[IGNORE_LABEL] = ns_labels[CHART_IGNORE_LABEL] = "ignore"
    await kube.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns, "labels": ns_labels}})
    ours = ph.mode != "plain"
    pods = [our_pod(f"p{i:05d}", s, run) if ours else plain_pod(f"p{i:05d}", s, run, WHOLE_CARD_MEMORY)
            for i, s in enumerate(mix)]
    rate = ph.rate
    if args.kwok:
        for p in pods:
            p["spec"]["tolerations"] = [{"key": KWOK_ANNOTATION, "operator": "Exists", "effect": "NoSchedule"}]
    bound_at: dict[str, float] = {}

    async def on_event(kind: str, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        if kind != "DELETED" and (pod.get("spec") or {}).get("nodeName") and name not in bound_at:
            bound_at[name] = time.monotonic()

    async def on_sync(items: list[dict[str, Any]]) -> None:
        for p in items:
            await on_event("ADDED", p)

    watch = Reflector(kube, f"/api/v1/namespaces/{ns}/pods", on_event, on_sync, f"bench-{ph.mode}")
    watch_task = asyncio.create_task(watch.run())
    await asyncio.wait_for(watch.synced.wait(), 30)
    before = scrape_all(target)
    cpu_before = cpu_seconds(target.pids)
    label = f"{ph.mode:5s} nodes={ph.nodes} replicas={ph.replicas} rep={ph.rep}"
    say(f"{label}: creating {len(pods)} pods in {ns} "
        f"({'all at once, ' + str(args.concurrency) + ' in flight' if not rate else f'{rate:g}/s'})")
    create_ms: list[float] = []
    rejected: list[str] = []
    t_start = time.monotonic()
    created_done = 0

    async def create(i: int, pod: dict[str, Any]) -> None:
        nonlocal created_done
        if rate:
            await asyncio.sleep(max(0.0, t_start + i / rate - time.monotonic()))
        t = time.monotonic()
        try:
            await kube.request("POST", f"/api/v1/namespaces/{ns}/pods", pod)
            create_ms.append((time.monotonic() - t) * 1000)
        except Exception as e:
            rejected.append(f"{pod['metadata']['name']}: {e}"[:300])
        created_done += 1

    sem = asyncio.Semaphore(args.concurrency if not rate else 10**6)

    async def limited(i: int, pod: dict[str, Any]) -> None:
        async with sem:
            await create(i, pod)

    creator = asyncio.gather(*(limited(i, p) for i, p in enumerate(pods)))
    deadline = t_start + args.timeout
    t_created = 0.0
    last_print = 0.0
    timed_out = False
    while True:
        await asyncio.sleep(0.2)
        now = time.monotonic()
        if creator.done() and not t_created:
            t_created = now
            await creator  # surface unexpected errors
        expected = len(pods) - len(rejected)
        if creator.done() and len(bound_at) >= expected:
            break
        if now > deadline:
            timed_out = True
            break
        if now - last_print >= 2.0:
            last_print = now
            say(f"{label}: created {created_done}/{len(pods)}, bound {len(bound_at)} "
                f"({len(bound_at) / (now - t_start):.1f} pods/s so far)")
    if not creator.done():
        creator.cancel()
        with contextlib.suppress(BaseException):
            await creator
    t_end = max(bound_at.values()) if bound_at else time.monotonic()
    cpu_after = cpu_seconds(target.pids)
    await asyncio.sleep(1.0)  # let the last binds' metrics land
    after = scrape_all(target)
    d = {k: prom.diff(after.get(k, {}), before.get(k, {})) for k in after}
    bound = len(bound_at)
    first_bind = min(bound_at.values()) if bound_at else t_end
    res: dict[str, Any] = {
        "mode": ph.mode, "nodes": ph.nodes, "replicas": ph.replicas, "rep": ph.rep, "rate": rate, "namespace": ns,
        "pods": len(pods), "created": len(pods) - len(rejected), "rejected": len(rejected),
        "rejections": rejected[:5], "bound": bound, "timed_out": timed_out,
        "seconds": round(t_end - t_start, 3),
        "throughput_pods_s": round(bound / (t_end - t_start), 2) if bound else 0.0,
        "sched_window_pods_s": round(bound / (t_end - first_bind), 2) if bound > 1 and t_end > first_bind else None,
        "create_seconds": round((t_created or t_end) - t_start, 3),
        "create_rate_pods_s": round(len(pods) / ((t_created or t_end) - t_start), 1),
        "create_p50_ms": round(statistics.median(create_ms), 2) if create_ms else None,
        "create_p99_ms": round(sorted(create_ms)[int(0.99 * (len(create_ms) - 1))], 2) if create_ms else None,
    }
    cpu = {k: round(v - cpu_before.get(k, 0.0), 2) for k, v in cpu_after.items()}
    res["cpu_seconds"] = dict(sorted(cpu.items(), key=lambda kv: -kv[1]))
    res["cpu_ms_per_pod"] = {k: round(1000 * v / bound, 2) for k, v in res["cpu_seconds"].items()} if bound else {}
    res["cpu_busy_share"] = round(sum(cpu.values()) / ((os.cpu_count() or 1) * (t_end - t_start)), 3)
    res["scheduling_cycle"] = scheduling_cycle(d)
    say(f"{label}: {bound}/{len(pods)} bound in {res['seconds']}s = {res['throughput_pods_s']} pods/s "
        f"(creates took {res['create_seconds']}s){' TIMED OUT' if timed_out else ''}; kube-scheduler "
        f"algorithm per pod {res['scheduling_cycle'].get('mean_ms')} ms mean (serial bound "
        f"{res['scheduling_cycle'].get('serial_bound_pods_s')} pods/s)")
    if res["cpu_ms_per_pod"]:
        say(f"{label}: CPU ms per pod: " + ", ".join(f"{k} {v}" for k, v in res["cpu_ms_per_pod"].items())
            + f" (machine busy {100 * res['cpu_busy_share']:.0f}% of {os.cpu_count()} CPUs)")
    if ours:
        res["latency"] = latency(d, target.fine)
        ext = d.get("extender", {})
        calls = prom.total(ext, "mtsched_bench_filter_calls_total") or prom.total(ext, "mtsched_bench_filter_calls")
        nodes_sum = prom.total(ext, "mtsched_bench_filter_nodes_total") or prom.total(ext, "mtsched_bench_filter_nodes")
        res["filter_nodes_mean"] = round(nodes_sum / calls, 1) if calls else None
        res["filter_calls_per_pod"] = round(res["latency"]["filter"]["count"] / bound, 3) if bound else None
        rt = round_trips(d)
        res["redis_round_trips"] = rt
        res["redis_per_pod"] = {k: round(sum(v.values()) / bound, 3) if bound else None for k, v in rt.items()}
        res["bindings"] = {dict(ls).get("result", "?"): int(v) for (n, ls), v in ext.items()
                           if n == "mtsched_bindings_total" and v}
        res["reservation_conflicts"] = int(prom.total(ext, "mtsched_reservation_conflicts_total"))
        res["connections_per_pod"] = {k: round(prom.total(v, "mtsched_bench_connections_total") / bound, 3)
                                      for k, v in d.items() if k in ("extender", "webhook")} if bound else {}
        res["overcommit_observed_by_watcher"] = int(prom.total(d.get("watcher", {}),
                                                               "mtsched_overcommit_observed_total"))
        res["correctness"] = await check(kube, ns, ledger, node_names, bound)
        lat = res["latency"]
        say(f"{label}: filter p50/p99 {lat['filter']['p50_ms']}/{lat['filter']['p99_ms']} ms over "
            f"{res['filter_nodes_mean']} nodes, prioritize {lat['prioritize']['p50_ms']}/{lat['prioritize']['p99_ms']}"
            f" ms, bind {lat['bind']['p50_ms']}/{lat['bind']['p99_ms']} ms, webhook "
            f"{lat['webhook']['p50_ms']}/{lat['webhook']['p99_ms']} ms; Redis round trips per pod "
            f"{res['redis_per_pod']}; {res['correctness']}")
    # delete everything, then look for leaked reservations
    before_del = scrape_all(target)
    t = time.monotonic()
    await kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods", query={"gracePeriodSeconds": 0})
    while True:
        if not await list_all(kube, f"/api/v1/namespaces/{ns}/pods") or time.monotonic() - t > args.timeout:
            break
        await asyncio.sleep(1.0)
    res["delete_seconds"] = round(time.monotonic() - t, 2)
    if ledger is not None:
        _, snaps = await ledger.wait(node_names, lambda s: not any(x.reservations for x in s.values()), 90)
        leaked = [u for x in snaps.values() for u in x.reservations]
        res["leaked_reservations"] = len(leaked)
        res["leaked_examples"] = leaked[:5]
        res["release_seconds"] = round(time.monotonic() - t, 2)
    after_del = scrape_all(target)
    if ours:
        dd = {k: prom.diff(after_del.get(k, {}), before_del.get(k, {})) for k in after_del}
        res["redis_round_trips_delete"] = round_trips(dd)
    watch_task.cancel()
    with contextlib.suppress(BaseException):
        await watch_task
    with contextlib.suppress(Exception):
        await kube.request("DELETE", f"/api/v1/namespaces/{ns}", ok=(200, 202, 404))
    say(f"{label}: deleted in {res['delete_seconds']}s"
        + (f", leaked reservations: {res['leaked_reservations']}" if "leaked_reservations" in res else ""))
    ph.result, ph.diff = res, d


async def check(kube: Any, ns: str, ledger: LedgerView | None, node_names: list[str], bound: int) -> dict[str, Any]:
    """Over-commit (ledger and annotations), unannotated bindings, ledger/annotation agreement."""
    from shared.annotations import ALLOCATED, AnnotationError, usage_from_annotations

    pods = await list_all(kube, f"/api/v1/namespaces/{ns}/pods")
    usage: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0, 0])
    unannotated = bad = 0
    kinds: Counter[str] = Counter()
    for p in pods:
        if not (p.get("spec") or {}).get("nodeName"):
            kinds["pending"] += 1
            continue
        if ALLOCATED not in ((p.get("metadata") or {}).get("annotations") or {}):
            unannotated += 1
            continue
        try:
            u = usage_from_annotations(p)
        except AnnotationError:
            bad += 1
            continue
        if u is None:
            continue
        kinds[f"{len(u.cards)}card"] += 1
        for c in u.cards:
            acc = usage[(u.node, c)]
            acc[0] += u.memory
            acc[1] += u.cores
            acc[2] += u.slices
    over_ann = [f"{n}/{c}" for (n, c), (m, k, s) in usage.items() if m > node_model(n) or k > 16 or s > 16]
    out: dict[str, Any] = {"overcommitted_cards_annotations": len(over_ann), "unannotated_bound": unannotated,
                           "undecodable": bad, "pending": kinds.pop("pending", 0), "placed": dict(kinds)}
    # why pods waited: warning events by reason, with an example message each
    reasons: Counter[str] = Counter()
    examples: dict[str, str] = {}
    with contextlib.suppress(Exception):
        for e in await list_all(kube, f"/api/v1/namespaces/{ns}/events", fieldSelector="type=Warning"):
            reasons[e.get("reason") or "?"] += int(e.get("count") or 1)
            examples.setdefault(e.get("reason") or "?", str(e.get("message") or "")[:300])
    out["warnings"] = {r: {"count": n, "example": examples[r]} for r, n in reasons.most_common()}
    if ledger is not None:
        def settled(s: dict[str, Any]) -> bool:
            res = [r for x in s.values() for r in x.reservations.values()]
            return len(res) >= bound and all(r.state == "bound" for r in res)

        ok, snaps = await ledger.wait(node_names, settled, 30)
        over_l = mismatch = 0
        for node, snap in snaps.items():
            for idx, c in snap.cards.items():
                if c.mem_used > c.capacity or c.cores_used > c.cores or c.slices > c.slice_limit \
                        or c.mem_free < 0 or c.cores_free < 0:
                    over_l += 1
                if [c.mem_used, c.cores_used, c.slices] != usage.get((node, idx), [0, 0, 0]):
                    mismatch += 1
        out.update(overcommitted_cards_ledger=over_l, ledger_annotation_mismatches=mismatch, ledger_settled=ok)
    return out


# -- summary, results, plot -------------------------------------------------------------------------

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


if __name__ == "__main__":
    sys.exit(main())
