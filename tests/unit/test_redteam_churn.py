"""Red team (nodes and pods churning for weeks), in-process: a deleted node's entry in the mismatch reporter's event
times was kept until the next re-list (weeks on a stable watch), and the pod watcher's set of pods seen ending was
rebuilt whole at every release once it held 50,000 (6.8 ms a release for as long as a burst of endings lasted)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import controller.pod_watch as pod_watch
from controller.mismatch import MismatchReporter
from controller.pod_watch import ENDED_SECONDS, PodWatcher
from shared.config import load_config
from shared.domain.node import node_inventory

CFG = load_config(env={}, flags={"memoryPerCard": "96,160"})


class NoKube:
    async def request(self, *a: Any, **k: Any) -> Any:
        return {}


def odd_node(name: str) -> dict[str, Any]:
    cap = {"mthreads.com/sgpu-core": "32", "mthreads.com/sgpu-memory": "256"}  # 128 units: no configured model
    return {"metadata": {"name": name, "uid": "u-" + name}, "status": {"capacity": cap, "allocatable": cap}}


async def test_a_deleted_nodes_event_time_is_forgotten() -> None:
    m = MismatchReporter(NoKube(), CFG)  # type: ignore[arg-type]
    for i in range(50):
        n = odd_node(f"spot-{i}")
        m.observe(f"spot-{i}", n, node_inventory(n, CFG))  # added, mismatched: one event
        assert (f"spot-{i}", True) in m._event_at
        m.observe(f"spot-{i}", n, None)  # deleted
    await asyncio.sleep(0)
    assert m._event_at == {} and m._owed == {} and m.problems == {} and m.uids == {}


async def test_pods_seen_ending_are_dropped_oldest_first_a_few_per_release(monkeypatch: pytest.MonkeyPatch) -> None:
    class Mirror:
        moving: frozenset[str] = frozenset()

        def owner_of(self, uid: str, hint: str | None) -> None:
            return None

    now = [1000.0]
    monkeypatch.setattr(pod_watch.time, "monotonic", lambda: now[0])
    w = PodWatcher(NoKube(), None, Mirror(), CFG, asyncio.Event())  # type: ignore[arg-type]
    pod = {"metadata": {"uid": "x", "name": "x", "namespace": "ns"}, "spec": {}}
    for i in range(60000):  # a namespace deleted: 60,000 pods ending within the window
        await w.release(f"a{i}", pod, "deleted")
    kept = w.ended
    assert len(kept) == 60000  # all within the window: kept, and not rebuilt at each release
    await w.release("a7", pod, "deleted")  # seen again: moved to the end, its time renewed
    assert list(w.ended)[-1] == "a7" and w.ended is kept
    now[0] += ENDED_SECONDS + 1  # every one of them older than the window now
    sizes = []
    for i in range(2000):
        await w.release(f"b{i}", pod, "deleted")
        sizes.append(len(w.ended))
    assert sizes[0] == 60000 + 1 - 64 and sizes[1] == sizes[0] + 1 - 64  # a few of the oldest per release
    assert w.ended is kept and set(w.ended) == {f"b{i}" for i in range(2000)}
