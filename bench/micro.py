"""In-process micro-benchmark of the extender's filter and prioritize (no HTTP, no Redis calls).

A mirror holds N simulated nodes (half MTT S4000, half S5000, 8 cards each, 30 % of the cards
holding a random slice, so nearly every node differs: the worst case for the extender's memo);
each request shape is filtered once first (the cold cost, reported apart), then every iteration
filters one pod over `candidates` of them, prioritizes the survivors, and books the pod on the
best node through Mirror.apply (exactly as a feed message would), so the next call sees one
changed node, as in a real scheduling loop. Each request is decoded from JSON first (untimed), as
the handler gives it to filter.

  python -m bench.micro --nodes 1000 --candidates 500 --iterations 2000
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import time
from typing import Any

import orjson
from redis.asyncio import Redis

from bench.workload import admitted_pod, shapes
from controller.extender import Extender
from shared.config import load_config
from shared.domain.fit import fit
from shared.domain.request import pod_request
from shared.domain.state import CardRecord, NodeSnapshot
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror

MODELS = (96, 160)


def _card(index: int, capacity: int, mem: int, cores: int, slices: int) -> CardRecord:
    return CardRecord(index, capacity, mem, capacity - mem, 16, cores, 16 - cores, slices, 16, "ok")


def build_mirror(nodes: int, fill: float, seed: int = 1) -> Mirror:
    rng = random.Random(seed)
    mirror = Mirror(Ledger(Redis()))  # never connected: the mirror is filled by hand
    for i in range(nodes):
        cap = MODELS[i % 2]
        name = f"{'s4000' if cap == 96 else 's5000'}-{i:05d}"
        cards = {}
        for c in range(8):
            if rng.random() < fill:
                mem = rng.choice((2, 4, 8, 16, 32))
                cards[c] = _card(c, cap, mem, rng.choice((1, 2, 4)), 1)
            else:
                cards[c] = _card(c, cap, 0, 0, 0)
        mirror.put(NodeSnapshot(name, 1, cards=cards))
    mirror.ready.set()
    return mirror


def book(mirror: Mirror, node: str, uid: str, pod: dict[str, Any], ext: Extender) -> bool:
    """Book the pod on `node` through Mirror.apply, as the ledger's feed message would."""
    snap = mirror.nodes[node]
    req = pod_request(pod, ext.cfg)
    assert req is not None
    res = fit(snap.card_states(), req, {}, ext.cfg.gpu_scheduler_policy)
    if not res.ok:
        return False
    cards: dict[str, Any] = {}
    for idx, c in snap.cards.items():
        mem, cores, slices = c.mem_used, c.cores_used, c.slices
        if idx in res.cards:
            m, k, s = req.booking_for(c.capacity)
            mem, cores, slices = mem + m, cores + k, slices + s
        cards[str(idx)] = {"capacity": c.capacity, "mem_used": mem, "mem_free": c.capacity - mem,
                           "cores": c.cores, "cores_used": cores, "cores_free": c.cores - cores,
                           "slices": slices, "slice_limit": c.slice_limit, "health": c.health}
    m, k, s = req.booking_for(snap.cards[res.cards[0]].capacity)
    msg = {"node": node, "version": snap.version + 1, "kind": "reserve", "cards": cards, "uid": uid,
           "res": {"cards": ",".join(map(str, res.cards)), "mem": m, "cores": k, "slices": s, "state": "bound",
                   "created": 0}}
    assert mirror.apply(msg) is None
    return True


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else 0.0


def run(nodes: int, candidates: int, iterations: int, fill: float = 0.3, seed: int = 1,
        top_k: int = 0) -> dict[str, Any]:
    cfg = load_config(env={}, flags={"memoryPerCard": "96,160", "eventsEnabled": "false",
                                     "filterTopK": str(top_k)})
    mirror = build_mirror(nodes, fill, seed)
    ext = Extender(cfg, mirror.ledger, mirror, None)
    names = sorted(mirror.nodes)
    rng = random.Random(seed)
    mix = shapes(iterations, seed)
    # Cold: the first pod of each request shape fits every candidate node (one fit() per distinct card
    # state; here every node's cards differ, the worst case). A running extender has seen the shapes.
    cold: list[float] = []
    for j, shape in enumerate(sorted(set(mix), key=str)):
        pod = admitted_pod(f"w{j}", shape, 160, uid=f"w{j}")
        t0 = time.perf_counter()
        ext.filter({"Pod": pod, "NodeNames": rng.sample(names, min(candidates, len(names)))})
        cold.append(time.perf_counter() - t0)
    t_filter: list[float] = []
    t_prio: list[float] = []
    passed: list[int] = []
    for i, shape in enumerate(mix):
        pod = admitted_pod(f"p{i}", shape, 160, uid=f"uid-{i}")
        # decoded from JSON as the handler does: new strings, whose hashes are not cached yet (sampling the
        # mirror's own names would reuse its strings and their hashes, which no request does)
        args = orjson.loads(orjson.dumps({"Pod": pod, "NodeNames": rng.sample(names, min(candidates, len(names)))}))
        t0 = time.perf_counter()
        out = ext.filter(args)
        t1 = time.perf_counter()
        scores = ext.prioritize({"Pod": pod, "NodeNames": out["NodeNames"]})
        t2 = time.perf_counter()
        t_filter.append(t1 - t0)
        t_prio.append(t2 - t1)
        passed.append(len(out["NodeNames"]))
        if scores:
            best = max(scores, key=lambda s: s["Score"])["Host"]
            book(mirror, best, f"uid-{i}", pod, ext)
    ms = 1000.0
    return {
        "nodes": nodes, "candidates": min(candidates, nodes), "iterations": iterations, "filter_top_k": top_k,
        "filter_p50_ms": statistics.median(t_filter) * ms, "filter_p99_ms": pct(t_filter, 0.99) * ms,
        "filter_mean_ms": statistics.fmean(t_filter) * ms,
        "prioritize_p50_ms": statistics.median(t_prio) * ms, "prioritize_p99_ms": pct(t_prio, 0.99) * ms,
        "passing_nodes_mean": statistics.fmean(passed),
        "cold_shapes": len(cold), "filter_cold_mean_ms": statistics.fmean(cold) * ms,
        "filter_cold_max_ms": max(cold) * ms,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, nargs="+", default=[500, 1000])
    p.add_argument("--candidates", type=int, default=500)
    p.add_argument("--iterations", type=int, default=1000)
    p.add_argument("--filter-top-k", type=int, nargs="+", default=[0, 1],
                   help="filterTopK values, one run each (0: every feasible node; the chart's default is 1)")
    a = p.parse_args(argv)
    for n, top in itertools.product(a.nodes, a.filter_top_k):
        r = run(n, a.candidates, a.iterations, top_k=top)
        print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()), flush=True)


if __name__ == "__main__":
    main()
