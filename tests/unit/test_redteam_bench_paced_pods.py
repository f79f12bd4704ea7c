"""Red team, `--paced-pods`: the paced run (and a warm-up) took its pods from a mix of `--pods` shapes, so
`--pods 200 --paced-pods 1000` ran 200 paced pods, not the 1000 the option asked for, and the latency at
50 pods/s came from a fifth of the samples the docs say (`bench/load/cli.py` amain: `mix[:pods]`)."""

from __future__ import annotations

import argparse
from typing import Any

from bench.load.cli import plan
from bench.workload import shapes


def _args(**kw: Any) -> argparse.Namespace:
    base = {"pods": 200, "repeat": 2, "no_plain": False, "also_plain2": False, "rate": 0.0, "paced_rate": 50.0,
            "paced_pods": 1000, "large_pods": 1000, "large_annotation_kb": 50, "warmup_pods": 300, "seed": 7}
    return argparse.Namespace(**{**base, **kw})


def test_each_phase_gets_the_pods_it_asked_for() -> None:
    from bench.load.cli import workload  # the phases' pods (was shapes(--pods) in amain)

    args = _args()
    mix = workload(args)
    got = [(ph.mode, len(mix[:n])) for ph, n in plan(20, 1, 0, args, args.pods)]
    assert got == [("ours", 200), ("plain", 200), ("plain", 200), ("ours", 200), ("paced", 1000), ("large", 200)]
    assert len(mix[:args.warmup_pods]) == 300
    assert mix[:200] == shapes(200, 7)  # the bursts' pods are those of a mix of --pods: results stay comparable


def test_no_paced_run_no_longer_mix() -> None:
    from bench.load.cli import workload

    assert len(workload(_args(paced_rate=0.0, warmup_pods=0))) == 200
