"""The pod mix of the load benchmark: slices, exclusive cards and multi-card pods.

`our_pod` is what a user writes (the webhook completes it); `plain_pod` is the same pod as
kube-scheduler sees it after admission: the same three extended resources (vgpu, sgpu-memory,
sgpu-core, as twins our roles do not read), labeled so the webhook ignores it, for the
default-scheduler profile (no extender call). Both have the same node-level footprint, so the two
runs place the same load on the same nodes, and kube-scheduler checks as many resources per node
for each (its NodeResourcesFit validates every extended resource name a pod asks for, per node).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

VGPU, MEM, CORE = "mthreads.com/vgpu", "mthreads.com/sgpu-memory", "mthreads.com/sgpu-core"
# The plain phase's pods ask for these twins of MEM and CORE (the bench's nodes offer both, same amounts):
# the same node-level footprint for kube-scheduler, and nothing our roles react to. With MEM and CORE
# themselves our watchers saw pods bound without a record asking for cards, and quarantined and
# reconciled their nodes meanwhile: CPU of ours counted against plain (2.9 of its 11.6 ms per pod at 500
# nodes, 30 ms at 5,000, docs/benchmarks.md).
PLAIN_MEM, PLAIN_CORE = "bench.mtsched.io/sgpu-memory", "bench.mtsched.io/sgpu-core"
# ... and of VGPU, which our pods ask for too. In ours kube-scheduler validates its name on every node and
# then leaves it to the extender (managedResources, ignoredByScheduler); the nodes offer the twin in an
# amount no pod mix reaches (PLAIN_VGPU_CAPACITY), so it never decides a placement either. Runs before
# 2026-12-04 left it out (mode plain2, `--also-plain2`): plain then checked two resources per node to ours' three,
# 8-12 % more pods/s for plain, 0.05-0.08 on the ratio (run-20261204-040116, docs/benchmarks.md).
PLAIN_VGPU = "bench.mtsched.io/vgpu"
PLAIN_VGPU_CAPACITY = 1000  # > 110 pods per node x 2 cards per pod
IGNORE_LABEL = "mtsched.io/webhook"  # on a namespace, "ignore" skips the webhook (stack.py WEBHOOK_NAMESPACE_SELECTOR)
CHART_IGNORE_LABEL = "hami.io/webhook"  # the Helm chart's selector (deploy/helm/hami): same value
RUN_LABEL = "mtsched.io/bench-run"
SLICE_MEMORY = (2, 4, 8, 16, 32)
SLICE_CORES = (1, 1, 2, 4)


@dataclass(frozen=True)
class Shape:
    kind: str  # slice | exclusive | multi
    vgpu: int
    memory: int | None  # as the user writes it (None: left to the webhook)
    cores: int | None

    def admitted(self, whole_card_memory: int) -> tuple[int, int]:
        """(sgpu-memory, sgpu-core) after the webhook: exclusive/multi get whole cards of the largest model."""
        if self.kind == "slice":
            assert self.memory is not None and self.cores is not None
            return self.memory, self.cores
        return self.vgpu * whole_card_memory, self.vgpu * 16


def shapes(n: int, seed: int = 7, exclusive: float = 0.15, multi: float = 0.05) -> list[Shape]:
    """n pod shapes: mostly slices, `exclusive` whole cards, `multi` two-card pods (deterministic)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        x = rng.random()
        if x < multi:
            out.append(Shape("multi", 2, None, None))
        elif x < multi + exclusive:
            out.append(Shape("exclusive", 1, None, None))
        else:
            out.append(Shape("slice", 1, rng.choice(SLICE_MEMORY), rng.choice(SLICE_CORES)))
    return out


def _pod(name: str, limits: dict[str, str], labels: dict[str, str], scheduler: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}],
        "terminationGracePeriodSeconds": 0,
    }
    if scheduler:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}, "spec": spec}


def our_pod(name: str, shape: Shape, run: str) -> dict[str, Any]:
    limits = {VGPU: str(shape.vgpu)}
    if shape.memory is not None:
        limits[MEM] = str(shape.memory)
    if shape.cores is not None:
        limits[CORE] = str(shape.cores)
    return _pod(name, limits, {RUN_LABEL: run}, None)  # the webhook sets schedulerName hami-scheduler


def plain_pod(name: str, shape: Shape, run: str, whole_card_memory: int, vgpu_twin: bool = True) -> dict[str, Any]:
    mem, cores = shape.admitted(whole_card_memory)
    limits = {PLAIN_VGPU: str(shape.vgpu)} if vgpu_twin else {}
    return _pod(name, {**limits, PLAIN_MEM: str(mem), PLAIN_CORE: str(cores)},
                {RUN_LABEL: run, IGNORE_LABEL: "ignore", CHART_IGNORE_LABEL: "ignore"}, "default-scheduler")


def admitted_pod(name: str, shape: Shape, whole_card_memory: int, uid: str = "") -> dict[str, Any]:
    """What the extender receives for `our_pod` after admission (for the in-process benchmark)."""
    mem, cores = shape.admitted(whole_card_memory)
    pod = _pod(name, {VGPU: str(shape.vgpu), MEM: str(mem), CORE: str(cores)}, {}, "hami-scheduler")
    pod["metadata"].update(namespace="bench", uid=uid or name)
    if shape.vgpu > 1:
        pod["metadata"]["annotations"] = {"mthreads.com/request-gpu-num": str(shape.vgpu)}
    return pod
