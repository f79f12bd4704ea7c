"""In-process memory driver: what one role keeps per pod, by tracemalloc snapshots diffed around N pods.

No HTTP, no Redis, no API server: each role's own handlers are driven directly (the extender's filter
and bind over a hand-filled mirror, the webhook's handle_review, the watcher's pod and node event
handlers with a ledger that only answers), so what stays allocated after N pods is what the role's
own structures hold. It prints the retained bytes per pod (tracemalloc, Python objects only), the
largest allocation sites of the difference, and RSS before/after (VmRSS, with and without
malloc_trim, to tell Python's retained arenas from live objects).

  python -m bench.mem_drive --role extender --pods 1000 --annotation-kb 50
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import random
import tracemalloc
from typing import Any, cast

import orjson

from bench.micro import build_mirror
from bench.workload import admitted_pod, shapes
from shared.config import Config, load_config
from shared.domain.annotations import CardGrant, binding_annotations, device_id

PAYLOAD = "bench.mtsched.io/payload"


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def trim() -> None:
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def pods(n: int, kb: int, seed: int = 1) -> list[dict[str, Any]]:
    out = []
    for i, shape in enumerate(shapes(n, seed)):
        p = admitted_pod(f"p{i}", shape, 160, uid=f"uid-{i:06d}")
        p["metadata"].setdefault("annotations", {})
        if kb:
            p["metadata"]["annotations"][PAYLOAD] = "x" * (kb * 1024)
        out.append(p)
    return out


class _Ledger:
    """Answers like the ledger, keeps nothing (the driver measures the role, not a fake)."""

    async def observe(self, *_: Any, **__: Any) -> dict[str, Any]:
        return {"ok": True}

    async def release(self, *_: Any, **__: Any) -> bool:
        return True

    async def upsert_node(self, *_: Any, **__: Any) -> int:
        return 1

    async def list_node(self, *_: Any) -> None:
        return None

    async def replace_node(self, *_: Any, **__: Any) -> None:
        return None

    async def remove_node(self, *_: Any) -> None:
        return None


CANDIDATES = 100  # kube-scheduler's default: max(100, 10 % of nodes) names per filter (set by --candidates)


def drive_extender(cfg: Config, batch: list[dict[str, Any]], nodes: int) -> Any:
    from bench.micro import book
    from controller.extender import Extender
    mirror = build_mirror(nodes, 0.3)
    ext = Extender(cfg, mirror.ledger, mirror, None)
    names = sorted(mirror.nodes)
    rng = random.Random(1)

    def run(ps: list[dict[str, Any]]) -> None:
        for p in ps:  # filter, prioritize, then the booking's feed message: what each pod costs the extender
            out = ext.filter({"Pod": p, "NodeNames": rng.sample(names, min(CANDIDATES, len(names)))})
            scores = ext.prioritize({"Pod": p, "NodeNames": out["NodeNames"]})
            if scores:
                book(mirror, max(scores, key=lambda s: s["Score"])["Host"], p["metadata"]["uid"], p, ext)
    return ext, run


def drive_webhook(cfg: Config, batch: list[dict[str, Any]], nodes: int) -> Any:
    from webhook.server import handle_review

    def run(ps: list[dict[str, Any]]) -> None:
        for p in ps:
            obj = {k: v for k, v in p.items()}
            body = orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                 "request": {"uid": p["metadata"]["uid"], "operation": "CREATE",
                                             "kind": {"group": "", "version": "v1", "kind": "Pod"},
                                             "namespace": "bench", "object": obj}})
            handle_review(body, cfg, (96, 160))
    return None, run


def bound(p: dict[str, Any], node: str, cfg: Config) -> dict[str, Any]:
    """The pod as the watcher sees it after our bind (record, nodeName, Running)."""
    q: dict[str, Any] = orjson.loads(orjson.dumps(p))
    grants = [[CardGrant(device_id(node, 0), 1024, 10)]]
    q["metadata"]["annotations"].update(binding_annotations(node, grants, 1))
    q["spec"]["nodeName"] = node
    q["spec"]["schedulerName"] = cfg.scheduler_name
    q["status"] = {"phase": "Running"}
    return q


def drive_watcher(cfg: Config, batch: list[dict[str, Any]], nodes: int) -> Any:
    from controller.pod_watch import PodWatcher
    from shared.kube import Kube
    from shared.store.ledger import Ledger
    mirror = build_mirror(nodes, 0.0)
    names = sorted(mirror.nodes)
    w = PodWatcher(cast(Kube, None), cast(Ledger, _Ledger()), mirror, cfg, asyncio.Event())
    loop = asyncio.new_event_loop()

    def run(ps: list[dict[str, Any]]) -> None:
        async def go() -> None:
            for i, p in enumerate(ps):
                await w.on_event("MODIFIED", bound(p, names[i % len(names)], cfg))
        loop.run_until_complete(go())
    return w, run


def serve_webhook(port: int) -> None:
    """Child process: the webhook's aiohttp application (plain HTTP) on 127.0.0.1:`port`."""
    from aiohttp import web

    from webhook.server import BODY_LIMIT, Webhook
    cfg = load_config(env={}, flags={"memoryPerCard": "96,160"})
    app = web.Application(client_max_size=BODY_LIMIT)
    Webhook(cfg, lambda: (96, 160)).routes(app)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def http_webhook(n: int, kb: int, env: dict[str, str], parallel: int = 16) -> dict[str, float]:
    """RSS growth of a webhook process (its real HTTP server) over n reviews, as the bench sees it."""
    import os
    import socket
    import subprocess
    import sys

    import aiohttp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = f"from bench.mem_drive import serve_webhook; serve_webhook({port})"
    child = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, **env})

    def child_rss() -> int:
        with open(f"/proc/{child.pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))

    async def go() -> dict[str, float]:
        async with aiohttp.ClientSession() as http:
            url = f"http://127.0.0.1:{port}/mutate"
            for _ in range(200):
                try:
                    await http.get(f"http://127.0.0.1:{port}/")
                    break
                except aiohttp.ClientError:
                    await asyncio.sleep(0.05)

            async def send(ps: list[dict[str, Any]]) -> None:
                sem = asyncio.Semaphore(parallel)

                async def one(p: dict[str, Any]) -> None:
                    body = orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                         "request": {"uid": p["metadata"]["uid"], "operation": "CREATE",
                                                     "kind": {"group": "", "version": "v1", "kind": "Pod"},
                                                     "namespace": "bench", "object": p}})
                    async with sem, http.post(url, data=body) as r:
                        await r.read()
                await asyncio.gather(*(one(p) for p in ps))
            await send(pods(50, kb, seed=2))
            await asyncio.sleep(0.2)
            r0 = child_rss()
            await send(pods(n, kb))
            await asyncio.sleep(0.2)
            r1 = child_rss()
            await send(pods(n, kb, seed=3))
            await asyncio.sleep(0.2)
            r2 = child_rss()
            return {"rss_mib_per_1000_pods": (r1 - r0) / n * 1000 / 1024,
                    "second_batch_mib_per_1000_pods": (r2 - r1) / n * 1000 / 1024, "rss_mib_end": r2 / 1024}
    try:
        return asyncio.run(go())
    finally:
        child.terminate()
        child.wait()


ROLES = {"extender": drive_extender, "webhook": drive_webhook, "watcher": drive_watcher}


def measure(role: str, n: int, kb: int, nodes: int = 200, top: int = 12, trace: bool = True) -> dict[str, Any]:
    """Retained bytes (tracemalloc) and RSS growth over n pods; RSS only with trace=False (tracemalloc's own
    record of every live block is in the RSS otherwise)."""
    cfg = load_config(env={}, flags={"memoryPerCard": "96,160", "eventsEnabled": "false"})
    warm, batch = pods(50, kb, seed=2), pods(n, kb)
    for p in warm:
        p["metadata"]["uid"] = "warm-" + p["metadata"]["uid"]
    keep, run = ROLES[role](cfg, batch, nodes)
    run(warm)  # imports, first-shape memos, interned strings: not per pod
    # the driver's own copies of the pods are not the role's: measure against a baseline that holds them
    gc.collect()
    trim()
    rss0 = rss_kib()
    if trace:
        tracemalloc.start(12)
        s0 = tracemalloc.take_snapshot()
    run(batch)
    gc.collect()
    rss1 = rss_kib()
    if trace:
        s1 = tracemalloc.take_snapshot()
        tracemalloc.stop()
    trim()
    rss2 = rss_kib()
    diff = s1.compare_to(s0, "traceback") if trace else []
    retained = sum(d.size_diff for d in diff)
    sites = [(d.size_diff, d.count_diff, [str(f) for f in d.traceback.format()[-6:]])
             for d in sorted(diff, key=lambda d: -d.size_diff)[:top] if d.size_diff > 0]
    counted = {}
    if role == "extender":
        counted = {"pod_cache_mib": keep.pods.bytes / 2**20, "pod_cache_entries": len(keep.pods),
                   "memo_counted_mib": keep.memo.bytes / 2**20, "memo_node_answers":
                   sum(len(m) for _, m in keep.memo.fits.values())}
    del keep
    return {**counted, "role": role, "pods": n, "annotation_kb": kb,
            "retained_mib_per_1000_pods": retained / n * 1000 / 2**20,
            "rss_mib_per_1000_pods": (rss1 - rss0) / n * 1000 / 1024,
            "rss_mib_per_1000_pods_after_trim": (rss2 - rss0) / n * 1000 / 1024, "sites": sites}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--role", choices=sorted(ROLES), nargs="+", default=sorted(ROLES))
    p.add_argument("--pods", type=int, default=1000)
    p.add_argument("--annotation-kb", type=int, nargs="+", default=[0, 50])
    p.add_argument("--top", type=int, default=8)
    p.add_argument("--nodes", type=int, default=200)
    p.add_argument("--rss-only", action="store_true", help="no tracemalloc (its bookkeeping is in the RSS)")
    p.add_argument("--candidates", type=int, default=100)
    p.add_argument("--http", action="store_true",
                   help="instead: the webhook's real HTTP server in a child process, RSS per 1,000 reviews")
    p.add_argument("--parallel", type=int, default=16, help="reviews in flight at once (--http)")
    p.add_argument("--env", nargs="*", default=[], help="NAME=VALUE for that child (e.g. PYTHONMALLOC=malloc)")
    a = p.parse_args(argv)
    if a.http:
        env = dict(e.split("=", 1) for e in a.env)
        for kb in a.annotation_kb:
            out = http_webhook(a.pods, kb, env, a.parallel)
            print(f"webhook over HTTP kb={kb} pods={a.pods} env={env}: {out}", flush=True)
        return
    for role in a.role:
        for kb in a.annotation_kb:
            global CANDIDATES
            CANDIDATES = a.candidates
            r = measure(role, a.pods, kb, a.nodes, top=a.top, trace=not a.rss_only)
            print(f"{role} kb={kb} pods={a.pods}: retained {r['retained_mib_per_1000_pods']:.2f} MiB/1000 pods, RSS "
                  f"{r['rss_mib_per_1000_pods']:.1f} MiB/1000 pods, after malloc_trim "
                  f"{r['rss_mib_per_1000_pods_after_trim']:.1f}", flush=True)
            extra = {k: v for k, v in r.items() if k not in ("sites",) and k.startswith(("pod_", "memo_"))}
            if extra:
                print("  " + " ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in extra.items()))
            for size, count, tb in cast(list[tuple[int, int, list[str]]], r["sites"]):
                print(f"  +{size / 1024:.1f} KiB in {count} blocks:")
                for line in tb:
                    print("     " + line)


if __name__ == "__main__":
    main()

