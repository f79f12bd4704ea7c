"""The cluster under test: where pods go and /metrics are read (Target), the local control plane with
Redis and our roles (Local), the simulated nodes, and a read-only view of the ledger."""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import signal
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.workload import CORE, MEM, PLAIN_CORE, PLAIN_MEM, PLAIN_VGPU, PLAIN_VGPU_CAPACITY
from shared.config import redact_url
from shared.serving.logs import Progress

NODE_LABEL = "mtsched.io/bench-node"
NODE_PREFIX = "bench-node-"
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
    role_pids: tuple[int, ...] = ()  # those of them that are our roles run through bench.timed_role
    scheduler_metrics: tuple[str, str] | None = None  # (URL, bearer token) of kube-scheduler's /metrics
    apiserver_metrics: tuple[str, str] | None = None  # (URL, bearer token) of kube-apiserver's /metrics


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


def profile_window(role_pids: Sequence[int], sig: signal.Signals) -> None:
    """With MTSCHED_BENCH_PROFILE_WINDOW or MTSCHED_BENCH_SAMPLE_WINDOW set (the roles then run a windowed
    cProfile or stack sampler, bench/timed_role.py), start (SIGUSR1) or end (SIGUSR2) it in each of our roles;
    without them, nothing is sent (the default action of these signals ends a process, so nothing else, an
    external extender included, gets them)."""
    if not (os.environ.get("MTSCHED_BENCH_PROFILE_WINDOW") or os.environ.get("MTSCHED_BENCH_SAMPLE_WINDOW")):
        return
    for pid in role_pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


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
        self.percentage = 0  # kube-scheduler's percentageOfNodesToScore (0: its own default)
        self.server_name = ""  # tlsConfig.serverName of the extender entry (an external extender's)
        base = self.cp.scheduler_config

        def tuned() -> dict[str, Any]:
            from bench.load.external import tune_scheduler_config

            return tune_scheduler_config(base(), self.percentage, self.server_name)

        setattr(self.cp, "scheduler_config", tuned)  # noqa: B010 - every (re)start of kube-scheduler reads it

    def start(self) -> None:
        self.cp.start()
        self.say(f"kube-apiserver up at {self.cp.server_url}")
        self.redis.start()
        self.say(f"redis-server up at {redact_url(self.redis.url)}")

    def target(self, replicas: int, webhooks: int, extender_tls: str = "chart",
               settings: dict[str, str] | None = None) -> Target:
        """(Re)start our roles with `replicas` extenders; kube-scheduler is restarted to call them."""
        from bench.stack import BenchStack

        self.server_name = ""
        if self.stack is not None:
            self.stack.stop()
        self.stack = BenchStack(self.cp, self.redis.url, "96,160", extenders=replicas, webhooks=webhooks,
                                watchers=1, settings=dict(settings or {}), extender_tls=extender_tls).start()
        urls: dict[str, list[str]] = defaultdict(list)
        for role in self.stack.roles:
            urls[role.kind].append(f"http://127.0.0.1:{role.metrics_port}/metrics")
        self.say(f"mtsched up: {replicas} extender(s){' behind the random balancer' if replicas > 1 else ''}, "
                 f"{webhooks} webhook(s), 1 watcher; kube-scheduler restarted with the extender"
                 f" {self.stack.how_called()}")
        pids = self.plane_pids()
        for role in self.stack.roles:
            if role.proc is not None:
                pids[role.name] = role.proc.pid
        role_pids = tuple(role.proc.pid for role in self.stack.roles if role.proc is not None)
        for kind, (proc, _) in self.stack.balancers.items():
            pids[f"balancer-{kind}"] = proc.pid
        sched = (f"https://127.0.0.1:{self.cp._sched_port}/metrics", self.cp.token)
        return Target(str(self.cp.kubeconfig_path), dict(urls), self.redis.url, fine=True, replicas=replicas,
                      pids=pids, role_pids=role_pids, scheduler_metrics=sched, apiserver_metrics=self.api_metrics())

    def plane_pids(self) -> dict[str, int]:
        pids = {name: proc.popen.pid for name, proc in self.cp._procs.items()}
        if self.redis.proc is not None:
            pids["redis"] = self.redis.proc.pid
        return pids

    def external_target(self, ext: Any) -> Target:
        """Our roles stopped (the webhook stays registered: the external pods' namespace skips it), the
        chart's admission policy suspended (it lets only our extender's identity write allocation
        records; another extender writes its own), kube-scheduler restarted with only the external
        extender (under the chart's identity). The next `target` provisions everything again."""
        from deploy.local.identities import suspend_policies

        kubeconfig = None
        if self.stack is not None:
            self.stack.stop_roles()
            kubeconfig = self.stack.kubeconfig("kube-scheduler")
            suspend_policies(self.cp, self.stack.provision())
        self.server_name = ext.server_name
        self.cp.start_scheduler(ext.spec(), kubeconfig=kubeconfig)
        self.say(f"kube-scheduler restarted calling {ext.name} at {ext.url} (our roles stopped)")
        pids = self.plane_pids()
        pid = ext.process_id()
        if pid:
            pids[ext.name] = pid
        sched = (f"https://127.0.0.1:{self.cp._sched_port}/metrics", self.cp.token)
        return Target(str(self.cp.kubeconfig_path), {}, "", replicas=ext.name, pids=pids, scheduler_metrics=sched,
                      apiserver_metrics=self.api_metrics())

    def api_metrics(self) -> tuple[str, str]:
        return f"{self.cp.server_url}/metrics", self.cp.token

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


def twins(name: str) -> dict[str, str]:
    """The plain pods' twins a simulated node offers (bench/workload.py PLAIN_MEM, PLAIN_VGPU)."""
    from deploy.local import nodes as simulated

    have = simulated.gpu_node(name, node_model(name), sliced_cards=CARDS_PER_NODE)["status"]["allocatable"]
    return {PLAIN_MEM: have[MEM], PLAIN_CORE: have[CORE], PLAIN_VGPU: str(PLAIN_VGPU_CAPACITY)}


def node_body(name: str, kwok: bool) -> dict[str, Any]:
    """A simulated node as the bench creates it: 8 cards of its model, and the plain pods' twins."""
    from deploy.local import nodes as simulated

    body = simulated.gpu_node(name, node_model(name), sliced_cards=CARDS_PER_NODE, labels={NODE_LABEL: "true"})
    offered = twins(name)
    for res in ("capacity", "allocatable"):
        body["status"][res].update(offered)
    if kwok:
        body["metadata"]["annotations"] = {KWOK_ANNOTATION: "fake"}
        body["metadata"]["labels"]["type"] = "kwok"
        body["spec"]["taints"] = [{"key": KWOK_ANNOTATION, "value": "fake", "effect": "NoSchedule"}]
    return body


async def ensure_nodes(kube: Any, count: int, kwok: bool, say: Progress,
                       concurrency: int = 32) -> tuple[list[str], int]:
    """The simulated nodes bench-node-00000.. (count of them, created or removed to match), and how many
    were created now. Creates run `concurrency` at a time (5,000 nodes: about a minute here)."""
    nodes = await list_all(kube, "/api/v1/nodes", labelSelector=NODE_LABEL)
    existing = {n["metadata"]["name"] for n in nodes}
    want = [f"{NODE_PREFIX}{i:05d}" for i in range(count)]
    todo = [n for n in want if n not in existing]

    t = time.monotonic()
    await gather_limited(concurrency, [lambda n=n: kube.request("POST", "/api/v1/nodes",  # type: ignore[misc]
                                                                node_body(n, kwok)) for n in todo])
    # nodes kept from an earlier run (--keep-nodes, --kubeconfig) may lack a twin (the vgpu one before
    # 2026-12-04): every plain pod would then wait out --timeout, unschedulable
    stale = [n["metadata"]["name"] for n in nodes if n["metadata"]["name"] in want
             and twins(n["metadata"]["name"]).keys() - (n.get("status", {}).get("allocatable") or {}).keys()]
    await gather_limited(concurrency, [lambda n=n: kube.request(  # type: ignore[misc]
        "PATCH", f"/api/v1/nodes/{n}/status", {"status": {"capacity": twins(n), "allocatable": twins(n)}},
        content_type="application/merge-patch+json") for n in stale])
    extra = sorted(existing - set(want))
    await gather_limited(concurrency, [lambda n=n: kube.request("DELETE", f"/api/v1/nodes/{n}", ok=(200, 202, 404))  # type: ignore[misc]
                              for n in extra])
    say(f"nodes: {count} ({count // 2} S4000 + {count - count // 2} S5000, {CARDS_PER_NODE} cards each): "
        f"created {len(todo)}, removed {len(extra)}, twins added to {len(stale)} in {time.monotonic() - t:.1f}s")
    return want, len(todo)


async def delete_nodes(kube: Any) -> None:
    names = [n["metadata"]["name"] for n in await list_all(kube, "/api/v1/nodes", labelSelector=NODE_LABEL)]
    await gather_limited(32, [lambda n=n: kube.request("DELETE", f"/api/v1/nodes/{n}", ok=(200, 202, 404))  # type: ignore[misc]
                              for n in names])


# -- the ledger (when Redis is reachable) -----------------------------------------------------------

class LedgerView:
    def __init__(self, redis_url: str, prefix: str):
        from shared.store.ledger import Ledger, connect

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

