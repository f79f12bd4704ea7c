"""The extender's bind checks and bounded caches, on its verbs with recording stand-ins for the
ledger and the API server (tests/redis/test_extender_bind.py runs the same verbs on a real Redis)."""

from __future__ import annotations

import asyncio
from typing import Any

from controller.extender import MEMO_BYTES, POD_CACHE_BYTES, POD_ENTRY_BYTES
from shared.domain.fit import USE_UUID
from tests.unit._servers import FakeKube, FakeLedger, bind_args, extender, pod

SELECT = {"nodeSelector": {"pool": "gpu"}}


def setup() -> tuple[Any, FakeKube, FakeLedger]:
    kube, ledger = FakeKube(), FakeLedger()
    return extender(kube=kube, ledger=ledger), kube, ledger


async def test_bind_of_a_filtered_pod_without_constraints_reads_no_node() -> None:
    ext, kube, ledger = setup()
    assert ext.filter({"Pod": pod("u1"), "NodeNames": ["s4k", "s5k"]})["NodeNames"] == ["s4k", "s5k"]
    assert await ext.bind(bind_args("u1")) == {"Error": ""}
    assert ledger.placed == [("s5k", "u1")] and kube.bound == [("ns/p-u1", "u1", "s5k")]
    assert kube.node_reads == []  # no constraint to check: no extra API call per bind


async def test_bind_checks_the_node_labels_when_the_pod_has_constraints() -> None:
    ext, kube, ledger = setup()
    kube.nodes["s5k"] = {"metadata": {"name": "s5k", "labels": {"pool": "gpu"}}}
    ext.filter({"Pod": pod("u1", **SELECT), "NodeNames": ["s5k"]})
    assert await ext.bind(bind_args("u1")) == {"Error": ""}
    assert kube.node_reads == ["s5k"] and ledger.placed == [("s5k", "u1")]


async def test_bind_refuses_when_the_node_cannot_be_read() -> None:
    ext, kube, ledger = setup()
    ext.filter({"Pod": pod("u1", **SELECT), "NodeNames": ["s5k"]})
    out = await ext.bind(bind_args("u1"))  # kube has no node s5k: 404
    assert "labels of node s5k could not be read" in out["Error"] and "HTTP 404" in out["Error"]
    assert ledger.placed == [] and kube.bound == []
    await asyncio.sleep(0.01)  # events are fire-and-forget tasks
    assert [r for r, _ in kube.events] == ["BindingFailed"]


async def test_bind_refuses_a_uid_filtered_under_another_name() -> None:
    ext, kube, ledger = setup()
    ext.filter({"Pod": pod("u1"), "NodeNames": ["s5k"]})
    out = await ext.bind(bind_args("u1", name="someone-else"))
    assert out["Error"] == "bind: pod uid u1 was filtered as ns/p-u1, not ns/someone-else"
    assert ledger.placed == [] and kube.bound == []


async def test_bind_refuses_a_pod_whose_uid_is_not_the_one_asked() -> None:
    ext, kube, ledger = setup()
    kube.pods[("ns", "p-u1")] = pod("u-new")  # deleted and created again under the same name
    out = await ext.bind(bind_args("u1"))
    assert "has uid 'u-new', not 'u1'" in out["Error"]
    assert ledger.placed == [] and kube.bound == []


async def test_filter_places_a_pod_of_another_profile_nowhere() -> None:
    ext, _, _ = setup()
    p = pod("u1")
    p["spec"]["schedulerName"] = "default-scheduler"
    out = ext.filter({"Pod": p, "NodeNames": ["s4k", "s5k"]})
    assert out["NodeNames"] == [] and set(out["FailedAndUnresolvableNodes"]) == {"s4k", "s5k"}
    assert 'schedulerName "default-scheduler" is not "hami-scheduler"' in out["FailedAndUnresolvableNodes"]["s4k"]
    assert "u1" not in ext.pods


async def test_filter_with_node_objects_returns_the_fitting_objects() -> None:
    ext, _, _ = setup()
    nodes = [{"metadata": {"name": "s4k"}}, {"metadata": {"name": "s5k"}}, {"metadata": {"name": "ghost"}}]
    p = pod("u1", limits={"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "128", "mthreads.com/sgpu-core": "4"})
    out = ext.filter({"Pod": p, "Nodes": {"items": nodes}})
    assert out["NodeNames"] is None and out["Nodes"] == {"items": [nodes[1]]}
    scores = ext.prioritize({"Pod": p, "Nodes": {"items": nodes}})
    assert [s["Host"] for s in scores] == ["s4k", "s5k", "ghost"]


async def test_the_pod_cache_keeps_what_bind_needs_not_the_pod() -> None:
    ext, _, _ = setup()
    p = pod("u1")
    p["metadata"]["annotations"] = {"big": "x" * 1_000_000, USE_UUID: "s5k-mthreads-0"}
    ext.filter({"Pod": p, "NodeNames": ["s5k"]})
    seen = ext.pods.get("u1")
    assert seen is not None and dict(seen.annotations) == {USE_UUID: "s5k-mthreads-0"}
    assert ext.pods.bytes < 4096


async def test_the_pod_cache_is_bounded_by_bytes() -> None:
    ext, _, _ = setup()
    uuids = ",".join(f"s5k-mthreads-{i}" for i in range(12_000))  # ~200 KB: fit() reads it, so it is kept
    for i in range(100):
        p = pod(f"u{i}")
        p["metadata"]["annotations"] = {USE_UUID: uuids}
        ext.filter({"Pod": p, "NodeNames": ["s5k"]})
    assert len(uuids) < POD_ENTRY_BYTES and 100 * len(uuids) > POD_CACHE_BYTES
    assert 0 < len(ext.pods) < 100 and ext.pods.bytes <= POD_CACHE_BYTES
    assert "u99" in ext.pods and "u0" not in ext.pods  # the oldest went first
    # one over the per-entry bound is not kept at all: bind then reads that pod from the API server
    p = pod("huge")
    p["metadata"]["annotations"] = {USE_UUID: "x" * (POD_ENTRY_BYTES + 1)}
    ext.filter({"Pod": p, "NodeNames": ["s5k"]})
    assert "huge" not in ext.pods


async def test_fit_memos_are_counted_in_bytes_and_reset_past_the_bound() -> None:
    ext, _, _ = setup()
    p = pod("u1")
    p["metadata"]["annotations"] = {USE_UUID: "s5k-mthreads-0," + "y" * 100_000}
    ext.filter({"Pod": p, "NodeNames": ["s5k"]})
    assert ext.memo.bytes > 100_000  # the key holds the annotation value
    ext.memo.bytes = MEMO_BYTES + 1
    ext.filter({"Pod": pod("u2"), "NodeNames": ["s4k", "s5k"]})
    assert ext.memo.bytes < 100_000 and len(ext.memo.keys) == 1


async def test_event_memo_is_bounded_by_bytes() -> None:
    ext, _, _ = setup()
    for i in range(3000):
        ext.event({"metadata": {"uid": f"u{i}"}}, "FilteringFailed", "m" * 5000, "Warning")
    assert ext._recent.bytes <= ext._recent.max_bytes and len(ext._recent) < 3000
