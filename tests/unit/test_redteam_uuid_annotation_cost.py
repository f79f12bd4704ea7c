"""Red team: a pod's `mthreads.ai/use-gpuuuid` annotation was parsed once per candidate node.

fit() reads the pod's use-/nouse-gpuuuid lists for every node it fits (denied_cards), and split the
annotation text each time. A pod creator may write up to 256 KiB there: one filter over 2,000 nodes then
spent seconds of the extender's event loop (filter, bind and preempt of every pod wait meanwhile), again
for every such pod and after every change of the nodes. The list is now parsed once per value: counted
here by the splits of the value, not timed (speed is the benchmarks' to measure)."""

from __future__ import annotations

from typing import Any, SupportsIndex

from tests.unit._servers import CORE, MEM, VGPU, extender, pod

NODES = {f"n{i}": 96 for i in range(2000)}


class Counted(str):
    """An annotation value that counts how often it is split (its hash and equality are a str's)."""

    splits = 0

    def split(self, sep: str | None = None, maxsplit: SupportsIndex = -1) -> list[str]:  # type: ignore[override]
        Counted.splits += 1
        return super().split(sep, maxsplit)


def test_redteam_a_long_uuid_list_is_parsed_once_per_filter_not_once_per_node() -> None:
    ext = extender(nodes=NODES)
    names = list(NODES)
    ids = Counted(",".join(f"elsewhere-{i}-mthreads-0" for i in range(20000))[:250_000])  # names no card here
    p: dict[str, Any] = pod("u1", {VGPU: 1, MEM: 8, CORE: 1})
    p["metadata"]["annotations"] = {"mthreads.ai/use-gpuuuid": ids}
    Counted.splits = 0
    out = ext.filter({"Pod": p, "NodeNames": names, "Nodes": None})
    assert out["NodeNames"] == [] and len(out["FailedNodes"]) == len(names)  # no card is named: none fits
    assert Counted.splits <= 1, f"the annotation was split {Counted.splits} times for {len(names)} nodes"
