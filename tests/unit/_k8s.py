"""Builders for the Kubernetes JSON the domain code reads (pods, nodes) and a tiny JSONPatch applier.

Kept deliberately dumb: tests spell out the numbers they expect, the builders only save typing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from shared.config import Config
from shared.domain.fit import CardState
from shared.domain.models import parse_memory_per_card
from shared.domain.node import Card
from shared.domain.patch import apply_patch as apply_patch  # the tests apply the webhook's patches with it
from shared.domain.request import SliceRequest, pod_request

VGPU = "mthreads.com/vgpu"
MEM = "mthreads.com/sgpu-memory"
CORE = "mthreads.com/sgpu-core"
GPU = "mthreads.com/gpu"

S4000 = 96  # units of 512 MiB per card (48 GiB)
S5000 = 160  # 80 GiB


def cfg(models: object = (S4000,), **kw: Any) -> Config:
    return Config(
        memory_per_card=parse_memory_per_card(list(models) if isinstance(models, tuple) else models), **kw
    )


def ctr(
    name: str = "main",
    limits: Mapping[str, object] | None = None,
    requests: Mapping[str, object] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "busybox", **extra}
    res: dict[str, Any] = {}
    if limits is not None:
        res["limits"] = {
            k: str(v) if isinstance(v, int) and not isinstance(v, bool) else v for k, v in limits.items()
        }
    if requests is not None:
        res["requests"] = {
            k: str(v) if isinstance(v, int) and not isinstance(v, bool) else v for k, v in requests.items()
        }
    if res:
        c["resources"] = res
    return c


def slice_ctr(name: str = "main", memory: int = 32, cores: int | None = 8) -> dict[str, Any]:
    limits: dict[str, object] = {VGPU: 1, MEM: memory}
    if cores is not None:
        limits[CORE] = cores
    return ctr(name, limits)


def pod(
    *containers: dict[str, Any],
    init: Iterable[dict[str, Any]] = (),
    annotations: Mapping[str, str] | None = None,
    name: str = "p",
    **spec: Any,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "default", "uid": f"uid-{name}"}
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    body: dict[str, Any] = {"containers": list(containers), **spec}
    inits = list(init)
    if inits:
        body["initContainers"] = inits
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": body}


def node(
    name: str = "n1",
    cores: object = None,
    memory: object = None,
    *,
    gpu: object = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    capacity: dict[str, Any] = {"cpu": "64"}
    if gpu is not None:
        capacity[GPU] = str(gpu)
    if cores is not None:
        capacity[CORE] = str(cores)
    if memory is not None:
        capacity[MEM] = str(memory)
    meta: dict[str, Any] = {
        "name": name,
        "labels": dict(labels or {}),
        "annotations": dict(annotations or {}),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": meta,
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


def cards(capacity: int, n: int, node_name: str = "n1", **kw: Any) -> list[CardState]:
    """Idle CardStates for an n-card node of one model."""
    return [CardState(Card(node_name, i, capacity, **kw)) for i in range(n)]


def slice_request(config: Config, memory: int, cores: int) -> SliceRequest:
    """The request of a pod of one slice container (memory units, cores) under `config`."""
    req = pod_request(pod(slice_ctr("a", memory, cores)), config)
    assert req is not None
    return req


def whole_request(config: Config, n: int = 1) -> SliceRequest:
    """The request of a pod of one container asking for `n` whole cards under `config`."""
    req = pod_request(pod(ctr("a", limits={VGPU: n})), config)
    assert req is not None and req.whole_cards
    return req
