"""How long a /metrics scrape of the per-card gauges holds a watcher's event loop, side by side in one run:
prometheus_client's collector over the mirror (what shared/store/card_metrics.py did before) and the cached
text rendering it does now. Nodes of 8 cards; between two scrapes `--changed` of the nodes get a new
snapshot (bookings), as under load.

  python -m bench.scrape_micro --nodes 500 5000 --scrapes 5
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Iterator, Mapping
from dataclasses import replace

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from shared.domain.state import CardRecord, NodeSnapshot
from shared.store.card_metrics import FAMILIES, CardExposition


class CollectorBaseline(Collector):
    """The per-card gauges through prometheus_client, as card_metrics.CardCollector built them."""

    def __init__(self, nodes: Mapping[str, NodeSnapshot]):
        self.nodes = nodes

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["node", "device_uuid", "device_index", "device_type"]
        fams = [GaugeMetricFamily(m, h, labels=labels) for m, h, _ in FAMILIES]
        for node, snap in sorted(self.nodes.items()):
            for c in snap.cards.values():
                lv = [node, f"{node}-mthreads-{c.index}", str(c.index), "Mthreads"]
                for fam, (_, _, value) in zip(fams, FAMILIES, strict=True):
                    fam.add_metric(lv, value(c))
        yield from fams


def fleet(n: int) -> dict[str, NodeSnapshot]:
    cards = {i: CardRecord(i, 96, 0, 96, 16, 0, 16, 0, 16, "ok") for i in range(8)}
    return {f"node-{i:05d}": NodeSnapshot(f"node-{i:05d}", 1, cards=cards) for i in range(n)}


def churn(nodes: dict[str, NodeSnapshot], share: float, rng: random.Random) -> None:
    for name in rng.sample(sorted(nodes), max(1, int(len(nodes) * share))):
        s = nodes[name]
        c = s.cards[0]
        nodes[name] = replace(s, cards={**s.cards, 0: replace(c, mem_used=(c.mem_used + 8) % 96)})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[500, 5000])
    ap.add_argument("--scrapes", type=int, default=5)
    ap.add_argument("--changed", type=float, default=0.01, help="share of nodes changed between scrapes")
    args = ap.parse_args(argv)
    print("nodes | cards | MB/scrape | collector first/steady ms | cached first/steady ms | steady ratio")
    for n in args.nodes:
        nodes = fleet(n)
        registry = CollectorRegistry()
        registry.register(CollectorBaseline(nodes))
        cached = CardExposition(lambda nodes=nodes: nodes)  # type: ignore[misc]
        rng = random.Random(7)
        times: dict[str, list[float]] = {"collector": [], "cached": []}
        size = 0
        for _ in range(args.scrapes):
            for name, render in (("collector", lambda r=registry: generate_latest(r)), ("cached", cached.render)):
                t0 = time.perf_counter()
                out = render()
                times[name].append((time.perf_counter() - t0) * 1000)
                size = len(out)
            churn(nodes, args.changed, rng)
        col, cac = times["collector"], times["cached"]
        steady_col, steady_cac = sorted(col[1:])[len(col[1:]) // 2], sorted(cac[1:])[len(cac[1:]) // 2]
        print(f"{n} | {n * 8} | {size / 1e6:.1f} | {col[0]:.0f}/{steady_col:.0f} | {cac[0]:.0f}/{steady_cac:.0f} | "
              f"{steady_col / steady_cac:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
