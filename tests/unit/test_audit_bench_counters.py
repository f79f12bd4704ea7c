"""Audit, the load benchmark's correctness counters (annotation side and kube-scheduler's attempts): each one fed
the fault it is there to count, through the function the benchmark calls (`bench.load.checks.check`,
`bench.load.metrics.schedule_attempts`, `bench.load.report.summarize`), with pods annotated exactly as the
extender's bind writes them (`binding_annotations`). Each counter reads 0 on the clean input and more than 0 with
its fault; a failure to list the pods is an error, never 0. The ledger side: tests/redis/test_audit_bench_ledger.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from bench import prom
from bench.load.checks import check
from bench.load.metrics import schedule_attempts, window
from bench.load.phase import Phase
from bench.load.report import summarize
from shared.domain.annotations import ALLOCATED, CardGrant, binding_annotations, device_id
from shared.domain.models import UNIT_MIB

S4000 = "bench-node-00000"  # node_model: 96 units per card
S5000 = "bench-node-00001"  # 160


def pod(name: str, node: str = "", cards: tuple[int, ...] = (0,), units: int = 8, cores: int = 2,
        annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A pod of one container; bound (`node`) with the extender's record of `units` and `cores` on `cards`,
    unless `annotations` replaces the record."""
    ann = dict(annotations) if annotations is not None else (
        binding_annotations(node, [[CardGrant(device_id(node, c), units * UNIT_MIB, cores) for c in cards]],
                            1_700_000_000_000_000_000) if node else {})
    return {"metadata": {"name": name, "namespace": "ns", "annotations": ann},
            "spec": {"containers": [{"name": "c"}], **({"nodeName": node} if node else {})}}


class FakeKube:
    """The API server as `list_all` reads it: one page of the namespace's pods (and its events)."""

    def __init__(self, pods: list[dict[str, Any]], fail: Exception | None = None):
        self.pods, self.fail = pods, fail

    async def request(self, method: str, path: str, body: Any = None, query: Any = None, **kw: Any) -> Any:
        assert method == "GET"
        if self.fail is not None:
            raise self.fail
        return {"items": self.pods if path.endswith("/pods") else [], "metadata": {}}


CLEAN = [pod("a", S4000, units=48), pod("b", S4000, units=48), pod("c", S5000, cards=(0, 1), units=160, cores=16)]
CASES = {  # fault -> (pods, the counter it must raise, by how much)
    "two pods' records over-commit a card's memory": (
        [pod("a", S4000, units=64), pod("b", S4000, units=64)], "overcommitted_cards_annotations", 1),
    "over-committed cores": ([pod("a", S5000, cores=10), pod("b", S5000, cores=10)],
                             "overcommitted_cards_annotations", 1),
    "over-committed slices (17 pods on a card)": ([pod(f"p{i}", S5000, units=2, cores=0) for i in range(17)],
                                                 "overcommitted_cards_annotations", 1),
    "a bound pod without a record": ([*CLEAN, pod("x", S4000, annotations={})], "unannotated_bound", 1),
    "an undecodable record": ([*CLEAN, pod("x", S4000, annotations={ALLOCATED: "garbage"})], "undecodable", 1),
    "a record naming another node's card": (
        [*CLEAN, pod("x", S4000, annotations={ALLOCATED: f"{device_id(S5000, 0)},Mthreads,4096,2:;"})],
        "undecodable", 1),
    "a pod still pending": ([*CLEAN, pod("x")], "pending", 1),
}


async def test_clean_pods_count_nothing() -> None:
    out = await check(FakeKube(CLEAN), "ns", None, [S4000, S5000], 3)
    assert {k: out[k] for k in ("overcommitted_cards_annotations", "unannotated_bound", "undecodable", "pending")} \
        == dict.fromkeys(("overcommitted_cards_annotations", "unannotated_bound", "undecodable", "pending"), 0)
    assert out["placed"] == {"1card": 2, "2card": 1} and out["cards_used"] == 3  # every record was read


@pytest.mark.parametrize("fault", CASES)
async def test_each_annotation_counter_counts_its_fault(fault: str) -> None:
    pods, counter, want = CASES[fault]
    out = await check(FakeKube(pods), "ns", None, [S4000, S5000], len(pods))
    assert out[counter] == want, (fault, out)


async def test_a_failed_pod_list_is_an_error_not_zero() -> None:
    with pytest.raises(OSError):
        await check(FakeKube(CLEAN, fail=OSError("connection refused")), "ns", None, [S4000], 3)


SCHED = """# TYPE scheduler_schedule_attempts_total counter
scheduler_schedule_attempts_total{profile="hami-scheduler",result="scheduled"} %d
scheduler_schedule_attempts_total{profile="hami-scheduler",result="error"} %d
"""


@pytest.mark.parametrize(("erred", "want"), [(0, 0), (3, 3)])
def test_attempts_that_erred_reach_the_summary(erred: int, want: int) -> None:
    """From kube-scheduler's exposition through the phase's window to the summary's counter (ours and plain)."""
    before = {"kube-scheduler": prom.parse(SCHED % (10, 1))}
    after = {"kube-scheduler": prom.parse(SCHED % (50, 1 + erred))}
    phases = []
    for mode, rep in (("ours", 0), ("plain", 0)):
        ph = Phase(mode, 2, 1, rep)
        ph.result = {"throughput_pods_s": 10.0, "pods": 40, "bound": 40, "timed_out": False,
                     "schedule_attempts": schedule_attempts(window(after, before)), "leaked_reservations": 0,
                     "correctness": {"overcommitted_cards_ledger": 0, "ledger_annotation_mismatches": 0}}
        phases.append(ph)
    row = summarize(phases, fine=False)[0]
    assert (row["schedule_attempts_error"], row["schedule_attempts_error_plain"]) == (want, want)
    # kube-scheduler read at one end only: not checked (None), never 0
    assert "kube-scheduler" not in window(after, {})
