"""`mtsched demo`: the main job on an embedded default (run by controller/cli.py, which imports this
harness module only for that subcommand, so the roles never load the test harness).

Builds (first run only) and starts a real local control plane (etcd, kube-apiserver,
kube-scheduler), a Redis, our three roles with two extender and two webhook replicas, creates a
mixed MTT S4000 + S5000 cluster, applies the sample pods of deploy/examples/pods.yaml (from the
seed documents) and prints what happened to each pod and the card table.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from deploy.local import nodes as simulated
from deploy.local.controlplane import ControlPlane, ensure_binaries
from deploy.local.redis import RedisServer, new_password
from deploy.local.stack import Stack
from shared.config import redact_url
from shared.domain.models import ModelError, parse_memory_per_card
from shared.serving.logs import Progress

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "pods.yaml"
NAMESPACE = "demo"


def _limits(pod: dict[str, Any]) -> str:
    parts = []
    for c in pod["spec"]["containers"]:
        lim = (c.get("resources") or {}).get("limits") or {}
        parts.append(f"{c['name']}{{" + ", ".join(f"{k.split('/')[-1]}: {v}" for k, v in lim.items()) + "}")
    return " ".join(parts)


async def _apply(kubeconfig: str, say: Progress) -> list[tuple[str, str]]:
    from shared.domain.annotations import ALLOCATED, decode_allocation
    from shared.kube import Kube, KubeError

    kube = await Kube.create(kubeconfig)
    results: list[tuple[str, str]] = []
    try:
        cluster = [
            simulated.gpu_node("s4000-node-1", simulated.S4000_MEMORY_UNITS, sliced_cards=4, whole_cards=2),
            simulated.gpu_node("s5000-node-1", simulated.S5000_MEMORY_UNITS, sliced_cards=4, card_ids=[0, 2, 3, 5]),
            simulated.gpu_node("s5000-node-2", simulated.S5000_MEMORY_UNITS, sliced_cards=2),
        ]
        for node in cluster:
            await kube.request("POST", "/api/v1/nodes", node)
        say("created nodes: s4000-node-1 (4 sliced S4000 cards + 2 whole cards), s5000-node-1 (S5000 cards "
            "0,2,3,5), s5000-node-2 (2 S5000 cards)")
        await kube.request("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        await asyncio.sleep(1.5)  # the watcher streams the nodes into Redis
        pods = [d for d in yaml.safe_load_all(EXAMPLES.read_text()) if d]
        say(f"applying {len(pods)} sample pods from {EXAMPLES.relative_to(EXAMPLES.parents[2])}")
        created: list[dict[str, Any]] = []
        for pod in pods:
            name = pod["metadata"]["name"]
            try:
                created.append(await kube.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod))
            except KubeError as e:
                msg = e.body.get("message", str(e)) if isinstance(e.body, dict) else str(e)
                results.append((name, f"REJECTED  {_limits(pod)}\n      {msg}"))
        deadline = time.monotonic() + 30
        last_bound, quiet_since = -1, time.monotonic()
        while True:  # until every pod is bound, or the rest were refused a place and nothing moved for 3 s
            listed = await kube.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")
            events = await kube.request("GET", f"/api/v1/namespaces/{NAMESPACE}/events")
            failed = {e["involvedObject"].get("name") for e in events["items"] if e.get("type") == "Warning"}
            bound_now = sum(1 for p in listed["items"] if (p.get("spec") or {}).get("nodeName"))
            if bound_now != last_bound:
                last_bound, quiet_since = bound_now, time.monotonic()
            settled = all((p.get("spec") or {}).get("nodeName") or p["metadata"]["name"] in failed
                          for p in listed["items"])
            if bound_now == len(listed["items"]) or time.monotonic() > deadline or (
                    settled and time.monotonic() - quiet_since > 3):
                break
            await asyncio.sleep(0.5)
        for pod in listed["items"]:
            name = pod["metadata"]["name"]
            node = pod["spec"].get("nodeName")
            sched = pod["spec"].get("schedulerName")
            ann = pod["metadata"].get("annotations") or {}
            lim = _limits(pod)
            if node and ALLOCATED in ann:
                cards = [f"{g.device_id} ({g.memory_mib // 1024} GiB, {g.cores}/16 cores)"
                         for grants in decode_allocation(ann[ALLOCATED]) for g in grants]
                results.append((name, f"BOUND     {lim}\n      by {sched} to {', '.join(cards)}"))
            elif node:
                results.append((name, f"BOUND     {lim}\n      by {sched} to {node} (whole card, vendor plugin)"))
            else:
                why = [e["message"] for e in events["items"] if e["involvedObject"].get("name") == name
                       and e.get("reason") in ("FailedScheduling", "FilteringFailed")]
                results.append((name, f"PENDING   {lim}\n      " + (why[-1] if why else "waiting")))
        order = [p["metadata"]["name"] for p in pods]
        results.sort(key=lambda r: order.index(r[0]) if r[0] in order else 99)
        print()
        for name, what in results:
            print(f"  {name:30s} {what}")
        return results
    finally:
        await kube.close()


async def _table(redis_url: str) -> str:
    from controller.cards import card_table
    from shared.store.ledger import Ledger, connect

    client = connect(redis_url)
    try:
        return await card_table(Ledger(client))
    finally:
        await client.aclose()


def _stop_on_signals() -> None:
    """SIGTERM and SIGHUP (a closed terminal, a timeout's kill) stop the demo as Ctrl-C does: what it started runs
    in process groups of its own, which no signal to the demo reaches, so only its own cleanup stops them."""
    def interrupt(signum: int, _frame: object) -> None:
        for again in (signal.SIGTERM, signal.SIGHUP):  # a second one must not cut the cleanup short
            signal.signal(again, signal.SIG_IGN)
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)


def run_demo(memory_per_card: str = "96,160", keep: bool = False) -> int:
    try:  # refused before anything starts (it was read only once the control plane was up)
        models = parse_memory_per_card(memory_per_card)
    except ModelError as e:
        print(f"mtsched demo: --memory-per-card: {e}", file=sys.stderr)
        return 2
    memory_per_card = ",".join(str(m.memory) for m in models)
    _stop_on_signals()
    try:
        return _run_demo(memory_per_card, keep)
    except KeyboardInterrupt:
        print("mtsched demo: stopped; everything it started is stopped", file=sys.stderr)
        return 130


def _run_demo(memory_per_card: str, keep: bool) -> int:
    say = Progress()
    say("building the control plane if needed (first run only: kube-apiserver, kube-scheduler and etcd from "
        "their pinned Go modules; several minutes on 2 cores, then cached)")
    t = time.monotonic()
    bin_dir = ensure_binaries(progress=sys.stderr)
    say(f"binaries ready in {bin_dir} ({time.monotonic() - t:.0f}s)")
    cp = ControlPlane(bin_dir=bin_dir)
    redis = RedisServer(password=new_password())
    stack: Stack | None = None
    try:
        t = time.monotonic()
        cp.start()
        say(f"control plane up at {cp.server_url} ({time.monotonic() - t:.1f}s); kubeconfig {cp.kubeconfig_path}")
        redis.start()
        say(f"redis-server up at {redact_url(redis.url)} (AUTH on; the roles read the password from a file)")
        stack = Stack(cp, redis.url, memory_per_card, extenders=2, webhooks=2, watchers=1)
        stack.start()
        say(f"mtsched roles up (memoryPerCard [{memory_per_card}]): 1 watcher, 2 extenders and 2 webhooks behind "
            "random per-request balancers; kube-scheduler profile hami-scheduler calls the extender over HTTPS")
        results = asyncio.run(_apply(str(cp.kubeconfig_path), say))
        print()
        print(asyncio.run(_table(redis.url)))
        print()
        bound = sum(1 for _, r in results if r.startswith("BOUND"))
        rejected = sum(1 for _, r in results if r.startswith("REJECTED"))
        pending = sum(1 for _, r in results if r.startswith("PENDING"))
        say(f"done: {bound} bound, {rejected} rejected, {pending} pending. The same table any time: "
            f"mtsched cards --config {stack.config_path}")
        say(f"next run: ~{time.monotonic() - say.t0:.0f}s (binaries are cached)")
        if keep:
            say(f"kept running; try: KUBECONFIG={cp.kubeconfig_path} and REDISCLI_AUTH=$(cat "
                f"{stack.dir / 'redis-password'}) redis-cli -p {redis.port} --scan --pattern 'mt:*'. "
                "Ctrl-C (or a SIGTERM) to stop")
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass
        return 0 if bound and rejected else 1
    except Exception:
        if stack is not None:
            print(stack.logs(20), file=sys.stderr)
        print(cp.log_tails(20) if cp._procs else "", file=sys.stderr)
        raise
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # a second Ctrl-C or signal must not cut this short
            signal.signal(sig, signal.SIG_IGN)
        if stack is not None:
            stack.stop()
        redis.cleanup()
        cp.stop()
