"""One phase: create the pods, wait until they are bound, measure, check, delete, look for leaks."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from bench import prom
from bench.load import memory
from bench.load.checks import check, leaked_reservations
from bench.load.cluster import KWOK_ANNOTATION, LedgerView, Target, cpu_seconds, list_all, profile_window
from bench.load.metrics import (
    api_requests,
    batch_attempts,
    latency,
    round_trips,
    schedule_attempts,
    scheduling_cycle,
    scrape_all,
    window,
)
from bench.workload import CHART_IGNORE_LABEL, IGNORE_LABEL, RUN_LABEL, Shape, our_pod, plain_pod
from shared.serving.logs import Progress

WHOLE_CARD_MEMORY = 160  # the webhook gives exclusive/multi pods the largest reported model: S5000
LARGE_ANNOTATION = "bench.mtsched.io/payload"  # the large pods' filler (not a key the webhook owns)
OUR_MODES = ("ours", "paced", "large")  # through our webhook and extender
PLAIN_MODES = ("plain", "plain2")  # default-scheduler; plain2: without the vgpu twin (--also-plain2)


@dataclass
class Phase:
    mode: str  # ours | plain | plain2 (plain without the vgpu twin) | paced (ours at a steady rate) | large | external
    nodes: int
    replicas: int | str  # extender replicas, or the external extender's name
    rep: int
    rate: float = 0.0  # pods/s; 0: all at once
    percentage: int = 0  # kube-scheduler's percentageOfNodesToScore (0: its default)
    large_kb: int = 0  # large: the annotation's size per pod
    result: dict[str, Any] = field(default_factory=dict)
    diff: dict[str, prom.Scrape] = field(default_factory=dict)


async def run_phase(kube: Any, target: Target, ledger: LedgerView | None, node_names: list[str], mix: list[Shape],
                    ph: Phase, args: argparse.Namespace, say: Progress) -> None:
    from controller.reflector import Reflector

    run = uuid.uuid4().hex[:6]
    ns = f"bench-{ph.mode}-{run}"
    ns_labels = {RUN_LABEL: run}
    if ph.mode in (*PLAIN_MODES, "external"):  # external: created already admitted, the webhook must not see them
        ns_labels[IGNORE_LABEL] = ns_labels[CHART_IGNORE_LABEL] = "ignore"
    await kube.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns, "labels": ns_labels}})
    ours = ph.mode in OUR_MODES
    pods = make_pods(ph, mix, run)
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
    profile_window(target.role_pids, signal.SIGUSR1)
    mem_before = memory.sample(target.pids)
    label = (f"{ph.mode:6s} nodes={ph.nodes} replicas={ph.replicas} "
             + ("warm-up (not measured)" if ph.rep < 0 else f"rep={ph.rep}")
             + (f" pct={ph.percentage}" if ph.percentage else ""))
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
    profile_window(target.role_pids, signal.SIGUSR2)
    await asyncio.sleep(1.0)  # let the last binds' metrics land
    mem_bound = memory.sample(target.pids)  # the pods still exist: every cache holds them
    after = scrape_all(target)
    d = window(after, before)
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
    # None: kube-scheduler's /metrics not read at both ends (--kubeconfig, a failed scrape): not checked, not 0
    res["schedule_attempts"] = schedule_attempts(d) if "kube-scheduler" in d else None
    res["batch_attempts"] = batch_attempts(d)
    res["api_requests_per_pod"] = api_requests(d, bound)
    res["percentage_of_nodes_to_score"] = ph.percentage
    if ph.mode in PLAIN_MODES:  # which baseline this was (results before 2026-12-04: the two of plain2)
        res["extended_resources"] = sorted(pods[0]["spec"]["containers"][0]["resources"]["limits"]) if pods else []
    if ph.large_kb:
        res["annotation_kb_per_pod"] = ph.large_kb
    res["rss_mib_before"] = memory.mib(mem_before)
    res["rss_mib_bound"] = memory.mib(mem_bound)
    res["hwm_mib_bound"] = memory.mib(mem_bound, "hwm_kib")
    res["rss_mib_per_1000_pods"] = memory.growth_per_1000(mem_before, mem_bound, bound)
    say(f"{label}: {bound}/{len(pods)} bound in {res['seconds']}s = {res['throughput_pods_s']} pods/s "
        f"(creates took {res['create_seconds']}s){' TIMED OUT' if timed_out else ''}; kube-scheduler "
        f"algorithm per pod {res['scheduling_cycle'].get('mean_ms')} ms mean (serial bound "
        f"{res['scheduling_cycle'].get('serial_bound_pods_s')} pods/s); scheduling attempts "
        f"{res['schedule_attempts'] or 'not scraped'}; batching {res['batch_attempts'] or 'none'}")
    if res["cpu_ms_per_pod"]:
        say(f"{label}: CPU ms per pod: " + ", ".join(f"{k} {v}" for k, v in res["cpu_ms_per_pod"].items())
            + f" (machine busy {100 * res['cpu_busy_share']:.0f}% of {os.cpu_count()} CPUs)")
    if res["api_requests_per_pod"]:
        say(f"{label}: API requests per pod: "
            + ", ".join(f"{k} {v}" for k, v in res["api_requests_per_pod"].items()))
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
    elif ph.mode == "external":  # from the pods' annotations (ours' format; another extender may write none)
        res["correctness"] = await check(kube, ns, None, node_names, bound)
        say(f"{label}: {res['correctness']}")
    grow = memory.by_role(res["rss_mib_per_1000_pods"], extra=(str(ph.replicas),))
    if grow:
        say(f"{label}: RSS MiB per 1000 pods: " + ", ".join(f"{k} {v}" for k, v in grow.items()))
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
        leaked = await leaked_reservations(ledger, node_names, 90)
        res["leaked_reservations"] = len(leaked)
        res["leaked_examples"] = leaked[:5]
        res["release_seconds"] = round(time.monotonic() - t, 2)
    after_del = scrape_all(target)
    if ours:
        dd = window(after_del, before_del)
        res["redis_round_trips_delete"] = round_trips(dd)
    watch_task.cancel()
    with contextlib.suppress(BaseException):
        await watch_task
    with contextlib.suppress(Exception):
        await kube.request("DELETE", f"/api/v1/namespaces/{ns}", ok=(200, 202, 404))
    say(f"{label}: deleted in {res['delete_seconds']}s"
        + (f", leaked reservations: {res['leaked_reservations']}" if "leaked_reservations" in res else ""))
    ph.result, ph.diff = res, d


def make_pods(ph: Phase, mix: list[Shape], run: str) -> list[dict[str, Any]]:
    """The phase's pods: plain twins, pods as users write them (ours), or as our webhook admits them."""
    if ph.mode in PLAIN_MODES:
        return [plain_pod(f"p{i:05d}", s, run, WHOLE_CARD_MEMORY, vgpu_twin=ph.mode == "plain")
                for i, s in enumerate(mix)]
    pods = [our_pod(f"p{i:05d}", s, run) for i, s in enumerate(mix)]
    if ph.mode == "large":
        filler = "x" * (ph.large_kb * 1000)
        for p in pods:
            p["metadata"]["annotations"] = {LARGE_ANNOTATION: filler}
    if ph.mode == "external":
        from dataclasses import replace

        from bench.load.external import admit
        from shared.config import Config
        from shared.domain.models import CardModel

        cfg = replace(Config(), memory_per_card=(CardModel(96), CardModel(WHOLE_CARD_MEMORY)))
        pods = [admit(p, cfg, (96, WHOLE_CARD_MEMORY)) for p in pods]
    return pods
