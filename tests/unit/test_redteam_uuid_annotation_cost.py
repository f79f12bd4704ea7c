"""Red team: a pod's `mthreads.ai/use-gpuuuid` annotation was parsed once per candidate node.

fit() reads the pod's use-/nouse-gpuuuid lists for every node it fits (denied_cards), and split the
annotation text each time. A pod creator may write up to 256 KiB there: one filter over 2,000 nodes then
spent over 5 s of the extender's event loop (filter, bind and preempt of every pod wait meanwhile), again for
every such pod and after every change of the nodes, so a handful of them stall scheduling for everyone.
The list is now parsed once per value."""

from __future__ import annotations

import time

from tests.unit._servers import CORE, MEM, VGPU, extender, pod

NODES = {f"n{i}": 96 for i in range(2000)}


def test_redteam_a_long_uuid_list_costs_one_parse_not_one_per_node() -> None:
    ext = extender(nodes=NODES)
    names = list(NODES)
    plain = pod("plain", {VGPU: 1, MEM: 8, CORE: 1})
    t0 = time.perf_counter()
    ext.filter({"Pod": plain, "NodeNames": names, "Nodes": None})
    baseline = time.perf_counter() - t0
    ids = ",".join(f"elsewhere-{i}-mthreads-0" for i in range(20000))[:250_000]  # names no card here
    p = pod("u1", {VGPU: 1, MEM: 8, CORE: 1})
    p["metadata"]["annotations"] = {"mthreads.ai/use-gpuuuid": ids}
    t0 = time.perf_counter()
    out = ext.filter({"Pod": p, "NodeNames": names, "Nodes": None})
    took = time.perf_counter() - t0
    assert out["NodeNames"] == [] and len(out["FailedNodes"]) == len(names)
    assert took < max(1.0, 20 * baseline), f"one filter took {took:.2f} s (a plain pod's {baseline:.3f} s)"
