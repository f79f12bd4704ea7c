"""Simulated Moore Threads GPU nodes for the local control plane (no kubelet, no device plugin).

Nodes are created with their status (the apiserver keeps status given on create); later changes
must go through the ``/status`` subresource, because updates of the main resource keep the old
status. sgpu-memory is counted in 512 MiB units: 96 per MTT S4000 (48 GiB), 160 per S5000 (80 GiB);
sgpu-core in 16 units per card.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

CORES_PER_CARD = 16
S4000_MEMORY_UNITS = 96
S5000_MEMORY_UNITS = 160

RES_CORE = "mthreads.com/sgpu-core"
RES_MEMORY = "mthreads.com/sgpu-memory"
RES_WHOLE = "mthreads.com/gpu"
LABEL_GPU_NODE = "mthreads.com/gpu-node"
LABEL_SLICED_CORES = "mthreads.com/sgpu.cores"
LABEL_GPU_COUNT = "mthreads.com/gpu.count"

Json = dict[str, Any]


def gpu_node(
    name: str,
    memory_units_per_card: int,
    sliced_cards: int = 8,
    whole_cards: int = 0,
    card_ids: Sequence[int | str] | None = None,
    labels: Mapping[str, str] | None = None,
) -> Json:
    """A V1Node-shaped dict for a node with ``sliced_cards`` shared cards and ``whole_cards`` exclusive ones.

    ``memory_units_per_card`` names the card model: S4000_MEMORY_UNITS (96 = 48 GiB, MTT S4000) or
    S5000_MEMORY_UNITS (160 = 80 GiB, MTT S5000).

    ``card_ids`` are the ids of the sliced cards (default 0..sliced_cards-1); they form the
    ``mthreads.com/sgpu.cores`` label ("0-1-2-..."). ``mthreads.com/gpu.count`` is the total number
    of cards (sliced + whole).
    """
    ids = [str(i) for i in (card_ids if card_ids is not None else range(sliced_cards))]
    if len(ids) != sliced_cards:
        raise ValueError(f"{name}: {len(ids)} card ids for {sliced_cards} sliced cards")
    resources: Json = {
        "cpu": "64",
        "memory": "512Gi",
        # Without "pods" every pod fails NodeResourcesFit ("Too many pods").
        "pods": "110",
        RES_CORE: str(CORES_PER_CARD * sliced_cards),
        RES_MEMORY: str(memory_units_per_card * sliced_cards),
    }
    if whole_cards > 0:
        resources[RES_WHOLE] = str(whole_cards)
    node_labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        LABEL_GPU_NODE: "true",
        LABEL_SLICED_CORES: "-".join(ids),
        LABEL_GPU_COUNT: str(sliced_cards + whole_cards),
        **(labels or {}),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": node_labels},
        "spec": {},
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }


async def create_nodes(api_client: client.ApiClient, nodes: Iterable[Json]) -> list[client.V1Node]:
    """Create the nodes (status included) and return what the apiserver stored."""
    core = client.CoreV1Api(api_client)
    created = []
    for node in nodes:
        # The client sends dicts as-is; its V1Node hint is narrower than what it accepts.
        created.append(await core.create_node(body=cast(Any, node)))
    return created


async def set_capacity(
    api_client: client.ApiClient,
    name: str,
    capacity: Mapping[str, str | int | None],
    allocatable: Mapping[str, str | int | None] | None = None,
) -> client.V1Node:
    """Patch status.capacity / status.allocatable via the status subresource.

    ``allocatable`` defaults to ``capacity``. A None value removes that resource (merge-patch null).
    """

    def norm(m: Mapping[str, str | int | None]) -> dict[str, str | None]:
        return {k: (None if v is None else str(v)) for k, v in m.items()}

    body = {"status": {"capacity": norm(capacity), "allocatable": norm(allocatable or capacity)}}
    node: client.V1Node = await client.CoreV1Api(api_client).patch_node_status(name, body)
    return node


async def delete_nodes(api_client: client.ApiClient, names: Iterable[str]) -> None:
    """Delete the nodes; already-gone nodes are fine."""
    core = client.CoreV1Api(api_client)
    for name in names:
        try:
            await core.delete_node(name, grace_period_seconds=0)
        except ApiException as e:
            if e.status != 404:
                raise
