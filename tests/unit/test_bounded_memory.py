"""Per-pod structures stay within their byte bound whatever the pods carry (issue 14, bounded memory).

Sizes are measured on the structures themselves (a deep sys.getsizeof, each object counted once), not
as RSS: what is asserted is that a large annotation never reaches them and that the extender's byte
estimate is an upper bound of what an entry really holds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from typing import Any, cast

from bench.mem_drive import PAYLOAD, _Ledger, bound, pods
from bench.micro import build_mirror
from controller.extender import POD_CACHE_BYTES, POD_ENTRY_BYTES, Extender
from controller.pod_watch import PodWatcher
from shared.config import load_config
from shared.domain.annotations import ALLOCATED, GPU_INDEX
from shared.domain.fit import USE_UUID
from shared.kube import Kube
from shared.store.ledger import Ledger

CFG = load_config(env={}, flags={"memoryPerCard": "96,160", "eventsEnabled": "false"})
KB = 1024


def deep_size(obj: object, seen: set[int] | None = None) -> int:
    """Bytes of `obj` and of everything it references (dataclasses, containers, strings), once each."""
    seen = set() if seen is None else seen
    if id(obj) in seen or obj is None or isinstance(obj, (bool, type)):
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(deep_size(k, seen) + deep_size(v, seen) for k, v in obj.items())
    elif isinstance(obj, (list, tuple, set, frozenset)):
        size += sum(deep_size(x, seen) for x in obj)
    elif dataclasses.is_dataclass(obj):
        size += sum(deep_size(getattr(obj, f.name), seen) for f in dataclasses.fields(obj))
    return size


def test_the_extenders_pod_cache_keeps_what_bind_needs_within_its_byte_bound() -> None:
    mirror = build_mirror(20, 0.0)
    ext = Extender(CFG, mirror.ledger, mirror, None)
    names = sorted(mirror.nodes)
    batch = pods(400, 50)  # every pod carries a 50 KB annotation
    batch[0]["metadata"]["annotations"][USE_UUID] = "GPU-" + "a" * (300 * KB)  # read by fit: kept, but too big
    for p in batch:
        ext.filter({"Pod": p, "NodeNames": names})
    assert len(ext.pods) == 399 and batch[0]["metadata"]["uid"] not in ext.pods  # refused, bind reads the API
    assert ext.pods.bytes <= POD_CACHE_BYTES
    for p in batch[1:]:
        seen = ext.pods.get(p["metadata"]["uid"])
        assert seen is not None
        real = deep_size(seen)
        assert real <= seen.size() <= POD_ENTRY_BYTES, (real, seen.size())  # the estimate is an upper bound
        assert real < 4 * KB  # the 50 KB payload is not in it
        assert PAYLOAD not in seen.annotations


def test_the_extenders_pod_cache_stays_within_bytes_when_pods_outnumber_it() -> None:
    mirror = build_mirror(4, 0.0)
    ext = Extender(CFG, mirror.ledger, mirror, None)
    small = ext.pods.__class__(64 * KB, POD_ENTRY_BYTES)
    ext.pods = small
    for p in pods(500, 50):
        ext.filter({"Pod": p, "NodeNames": sorted(mirror.nodes)})
    assert 0 < len(small) < 500
    assert small.bytes <= 64 * KB
    assert sum(deep_size(small.get(k)) for k in list(small._items)) <= 64 * KB


def watcher_view(w: PodWatcher) -> int:
    seen: set[int] = set()
    w.holders("")  # (the view's index by node made: it counts too)
    return sum(deep_size(x, seen) for x in (w.seen, w.truth, w.unrecorded, w.ended, w._by_node))


def test_the_watchers_view_holds_a_bounded_record_per_pod_whatever_the_pod_carries() -> None:
    mirror = build_mirror(10, 0.0)
    names = sorted(mirror.nodes)
    w = PodWatcher(cast(Kube, None), cast(Ledger, _Ledger()), mirror, CFG, asyncio.Event())
    batch: list[dict[str, Any]] = [bound(p, names[i % len(names)], CFG) for i, p in enumerate(pods(300, 50))]
    # the worst a pod can carry into the view: an undecodable record and an absurd gpu-index, each 200 KB
    batch[0]["metadata"]["annotations"][ALLOCATED] = "x" * (200 * KB)
    del batch[1]["metadata"]["annotations"][ALLOCATED]
    batch[1]["metadata"]["annotations"][GPU_INDEX] = "0," * (100 * KB)

    async def feed() -> None:
        for p in batch:
            await w.on_event("MODIFIED", p)
    asyncio.run(feed())
    assert len(w.truth) == 300 and len(w.unrecorded) == 2  # the undecodable one is unaccounted too
    assert len(w.seen) == 299  # the record-less pod has nothing to record
    assert watcher_view(w) < 300 * 2 * KB  # under 2 KiB a pod; each carries over 50 KB
    assert w.unrecorded[batch[1]["metadata"]["uid"]].gpu_index == "unreadable"
    assert w.quarantine(names[1])  # an unreadable card list still closes the node (fail closed)


async def test_the_watcher_handles_a_changed_record_again() -> None:
    mirror = build_mirror(2, 0.0)
    node = sorted(mirror.nodes)[0]
    observed: list[str] = []

    class Counting(_Ledger):
        async def observe(self, uid: str, *_: Any, **__: Any) -> dict[str, Any]:
            observed.append(uid)
            return {"ok": True}

    w = PodWatcher(cast(Kube, None), cast(Ledger, Counting()), mirror, CFG, asyncio.Event())
    p = bound(pods(1, 0)[0], node, CFG)
    await w.on_event("MODIFIED", p)
    await w.on_event("MODIFIED", p)  # same record: handled once
    p["metadata"]["annotations"][ALLOCATED] = p["metadata"]["annotations"][ALLOCATED].replace(",1024,", ",2048,")
    await w.on_event("MODIFIED", p)
    assert observed == [p["metadata"]["uid"]] * 2
