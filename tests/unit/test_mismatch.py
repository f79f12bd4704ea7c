"""Mismatches are loud (issue 13 item 5): the kind of every node_inventory error, the admission warning of
pods that only mismatched nodes could take, and the watcher's reporter (gauge, once per change)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import REGISTRY

from controller.mismatch import MismatchReporter, event_body, event_name
from shared.domain.admission import decide, mismatch_warnings
from shared.domain.knobs import ANNOTATION as KNOBS
from shared.domain.node import (
    ANNOTATION_MISMATCH,
    CAPACITY_MISMATCH,
    LABEL_MISMATCH,
    MAX_INST_ANNOTATION,
    MODEL_MISMATCH,
    SGPU_CORES_LABEL,
    mismatch_kind,
    node_inventory,
)
from shared.domain.request import pod_request
from tests.unit._k8s import VGPU, cfg, ctr, node, pod, slice_ctr

C96 = cfg((96,))
MIXED = cfg((96, 160))

# (node, config, kind node_inventory must report, a phrase of its error)
NODES: list[tuple[dict[str, Any], Any, str, str]] = [
    (node("s5000", cores=32, memory=320), C96, MODEL_MISMATCH, "160 units per card (320/2) is no configured"),
    (node("odd", cores=32, memory=200), MIXED, MODEL_MISMATCH, "100 units per card"),
    (node("lbl", cores=32, memory=192, labels={SGPU_CORES_LABEL: "0-1-2"}), C96, LABEL_MISMATCH,
     "lists 3 cards but mthreads.com/sgpu-core capacity 32 means 2"),
    (node("lbl2", cores=48, memory=288, labels={SGPU_CORES_LABEL: "0"}), C96, LABEL_MISMATCH, "lists 1 cards"),
    (node("dup", cores=32, memory=192, labels={SGPU_CORES_LABEL: "1-1"}), C96, LABEL_MISMATCH, "repeats"),
    (node("junk", cores=32, memory=192, labels={SGPU_CORES_LABEL: "a-b"}), C96, LABEL_MISMATCH, "not a list"),
    (node("c17", cores=17, memory=96), C96, CAPACITY_MISMATCH, "not a multiple of 16"),
    (node("cfrac", cores="1.5", memory=96), C96, CAPACITY_MISMATCH, "not a whole number"),
    (node("nomem", cores=32), C96, CAPACITY_MISMATCH, "missing or not a whole number"),
    (node("uneven", cores=48, memory=100), C96, CAPACITY_MISMATCH, "does not divide evenly"),
    (node("inst", cores=16, memory=96, annotations={MAX_INST_ANNOTATION: "17"}), C96, ANNOTATION_MISMATCH,
     "outside 1..16"),
    # the node agent's card knobs, unreadable: the node closes, and says so as a mismatch (event, gauge, alert)
    (node("knobs-json", cores=16, memory=96, annotations={KNOBS: "{"}), C96, ANNOTATION_MISMATCH, "is not JSON"),
    (node("knobs-card", cores=16, memory=96, annotations={KNOBS: '{"v": 1, "cards": {"x": {}}}'}), C96,
     ANNOTATION_MISMATCH, "is not a card index"),
    # a quoted text that reads like another kind's is still this kind (mismatch_kind reads how a text begins)
    (node("knobs-model", cores=16, memory=96, annotations={KNOBS: '{"v": 1, "cards": {}, '
                                                           '" is no configured card model; memoryPerCard ": 1}'}),
     C96, ANNOTATION_MISMATCH, "unknown field(s)"),
    (node("inst-model", cores=16, memory=96, annotations={MAX_INST_ANNOTATION: " is no configured card model; "
                                                                               "memoryPerCard "}),
     C96, ANNOTATION_MISMATCH, "outside 1..16"),
    (node("knobs-long", cores=16, memory=96, annotations={KNOBS: '{"v": 1, "cards": {}, "e": "' + "x" * 140000 + '"}'}),
     C96, ANNOTATION_MISMATCH, "longer than"),
]


@pytest.mark.parametrize(("n", "c", "kind", "phrase"), NODES, ids=[n[0]["metadata"]["name"] for n in NODES])
def test_every_inventory_error_has_a_kind_readable_from_its_text(n: dict[str, Any], c: Any, kind: str,
                                                                 phrase: str) -> None:
    inv = node_inventory(n, c)
    assert inv.cards == () and phrase in inv.error, inv
    assert inv.problem == kind
    # the ledger and the mirrors keep only the text: it must say the same kind
    assert mismatch_kind(inv.error) == kind


@pytest.mark.parametrize("error", ["", "2 pod(s) hold cards that nobody can account for: ns/a",
                                   "quarantined while unrecorded pods hold cards"])
def test_other_errors_are_no_mismatch(error: str) -> None:
    assert mismatch_kind(error) == ""


def test_good_nodes_report_no_problem() -> None:
    for n, c in ((node("ok", cores=32, memory=192), C96), (node("s5", cores=32, memory=320), MIXED),
                 (node("cpu"), C96)):
        assert node_inventory(n, c).problem == ""


S5000_ERR = "160 units per card (320/2) is no configured card model; memoryPerCard [96]"


@pytest.mark.parametrize(("memory", "reported", "mismatched", "warned"), [
    (64, (), {"s5000-a": S5000_ERR}, True),  # the only sliced node is closed: the pod can go nowhere
    (64, (96,), {"s5000-a": S5000_ERR}, False),  # an S4000 takes it: no warning
    (64, (), {}, False),  # no node at all: nothing to point at
    (64, (160,), {"s4000-b": "label ... lists 3 cards"}, False),
])
def test_mismatch_warning_only_when_no_usable_card_serves(memory: int, reported: tuple[int, ...],
                                                          mismatched: dict[str, str], warned: bool) -> None:
    c = MIXED
    req = pod_request(pod(slice_ctr(memory=memory, cores=4)), c)
    assert req is not None
    out = mismatch_warnings(req, reported, mismatched)
    assert bool(out) == warned
    if warned:
        assert "stays Pending" in out[0] and "mtsched explain" in out[0]
        assert out[1] == f"node s5000-a: {S5000_ERR}"
        assert all(len(w) <= 256 for w in out)


def test_model_pinned_pod_warned_when_only_other_models_are_usable() -> None:
    # [96, 160]: a 128-unit slice needs an S5000; the S5000 node's label disagrees, S4000s are fine
    req = pod_request(pod(slice_ctr(memory=128, cores=4)), MIXED)
    assert req is not None
    out = mismatch_warnings(req, (96,), {"s5000-x": "label mthreads.com/sgpu.cores='0-1-2' lists 3 cards"})
    assert len(out) == 2 and "s5000-x" in out[1]


def test_many_mismatched_nodes_are_counted_not_listed() -> None:
    req = pod_request(pod(slice_ctr(memory=8, cores=1)), C96)
    assert req is not None
    out = mismatch_warnings(req, (), {f"n{i}": S5000_ERR for i in range(5)})
    assert len(out) == 1 + 3 + 1 and out[-1] == "and 2 more node(s)"


def test_decide_adds_the_warning_and_still_allows() -> None:
    d = decide(pod(slice_ctr(memory=32, cores=2)), C96, (), {"s5000-a": S5000_ERR})
    assert d.allowed and any("stays Pending" in w for w in d.warnings), d
    d = decide(pod(slice_ctr(memory=32, cores=2)), C96, (96,), {"s5000-a": S5000_ERR})
    assert d.allowed and not any("stays Pending" in w for w in d.warnings)
    # exclusive: the whole-card fill warning stays, the mismatch warning comes after it
    d = decide(pod(ctr("x", {VGPU: 1})), C96, (), {"s5000-a": S5000_ERR})
    assert d.allowed and "exclusive mode" in d.warnings[0] and "stays Pending" in d.warnings[1]


def gauge(kind: str) -> float:
    return REGISTRY.get_sample_value("mtsched_node_mismatch", {"reason": kind}) or 0.0


def test_reporter_counts_changes_once_and_forgets_fixed_and_gone_nodes() -> None:
    r = MismatchReporter(None, C96)  # no API client: the view and the gauge only
    bad = node("s5000", cores=32, memory=320)
    r.observe("s5000", bad, node_inventory(bad, C96))
    r.observe("s5000", bad, node_inventory(bad, C96))  # heartbeat: same problem
    lbl = node("lbl", cores=32, memory=192, labels={SGPU_CORES_LABEL: "0-1-2"})
    r.observe("lbl", lbl, node_inventory(lbl, C96))
    r.synced({"s5000", "lbl"})
    assert gauge(MODEL_MISMATCH) == 1 and gauge(LABEL_MISMATCH) == 1 and gauge(CAPACITY_MISMATCH) == 0
    fixed = node("lbl", cores=32, memory=192, labels={SGPU_CORES_LABEL: "0-1"})
    r.observe("lbl", fixed, node_inventory(fixed, C96))
    assert gauge(LABEL_MISMATCH) == 0 and set(r.problems) == {"s5000"}
    r.synced(set())  # re-listed: the node is gone
    assert gauge(MODEL_MISMATCH) == 0 and r.problems == {}


def test_event_names_are_one_per_node_object_and_problem() -> None:
    a = event_name("n1", "uid-1", MODEL_MISMATCH, S5000_ERR)
    assert a == event_name("n1", "uid-1", MODEL_MISMATCH, S5000_ERR)  # every replica: the same name
    assert a != event_name("n1", "uid-2", MODEL_MISMATCH, S5000_ERR)  # node re-created
    assert a != event_name("n1", "uid-1", LABEL_MISMATCH, "label ...")  # another problem
    body = event_body("n1", "uid-1", MODEL_MISMATCH, S5000_ERR, "hami-scheduler")
    assert body["type"] == "Warning" and body["involvedObject"] == {"apiVersion": "v1", "kind": "Node",
                                                                    "name": "n1", "uid": "uid-1"}
    assert S5000_ERR in body["message"] and "model mismatch" in body["message"]


class _Events:
    """Stands in for the API client: records the events posted."""

    def __init__(self) -> None:
        self.posted: list[str] = []

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        self.posted.append(body["message"])
        return {}


async def test_a_writer_changing_an_annotation_at_will_gets_one_event_a_minute_per_node(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The node agent's identity may rewrite its card-knobs annotation as often as it likes, each value a problem
    of its own (red team: 500 values, 500 events): the gauge and the log follow every change, events one per
    node per EVENT_EVERY_SECONDS."""
    import controller.mismatch as mismatch

    clock = [1000.0]
    monkeypatch.setattr(mismatch.time, "monotonic", lambda: clock[0])
    api = _Events()
    r = MismatchReporter(api, C96)  # type: ignore[arg-type]
    for i in range(50):
        n = node("gpu-1", cores=16, memory=96, annotations={KNOBS: f'{{"v": 1, "cards": {{}}, "f{i}": 1}}'})
        r.observe("gpu-1", n, node_inventory(n, C96))
        other = node("gpu-2", cores=16, memory=96, annotations={KNOBS: f'{{"v": {i + 2}, "cards": {{}}}}'})
        r.observe("gpu-2", other, node_inventory(other, C96))
    await asyncio.gather(*r._tasks)
    assert len(api.posted) == 2 and gauge(ANNOTATION_MISMATCH) == 2  # one event for each node
    assert "'f0'" in api.posted[0] and r.problems["gpu-1"][1].endswith("'f49' in v1")  # the view: the latest
    clock[0] += mismatch.EVENT_EVERY_SECONDS
    n = node("gpu-1", cores=16, memory=96, annotations={KNOBS: '{"v": 1, "cards": {}, "g": 1}'})
    r.observe("gpu-1", n, node_inventory(n, C96))
    await asyncio.sleep(0)  # (the loop's clock is the patched one: gpu-2's owed event is due)
    await asyncio.gather(*r._tasks)
    assert len(api.posted) == 4, api.posted
    # gpu-1's new problem at once; gpu-2's event held back in the minute: its latest problem, now that it is due
    assert any("'g'" in m for m in api.posted[2:]) and any("version 51 " in m for m in api.posted[2:]), api.posted


LABEL_ERR = "label mthreads.com/sgpu.cores='0-1-2' lists 3 cards but mthreads.com/sgpu-core capacity 32 means 2"
KNOBS_ERR = "annotation mtsched.io/card-knobs: not JSON"


@pytest.mark.parametrize(("errors", "said", "not_said"), [
    ([S5000_ERR], "card model disagrees with the configuration", ["label", "annotation"]),
    ([LABEL_ERR, S5000_ERR], "sgpu.cores label or card model disagrees", ["annotation", "capacity"]),
    ([KNOBS_ERR], "card annotations cannot be read", ["label", "model", "capacity"]),
    ([KNOBS_ERR, LABEL_ERR], "sgpu.cores label disagrees with the configuration; card annotations", ["model"]),
])
def test_the_summary_names_only_the_kinds_present(errors: list[str], said: str, not_said: list[str]) -> None:
    from shared.domain.node import mismatch_causes

    text = mismatch_causes(errors)
    assert said in text, text
    assert not any(w in text for w in not_said), text
    req = pod_request(pod(slice_ctr(memory=8, cores=1)), C96)
    assert req is not None
    warning = mismatch_warnings(req, (), {f"n{i}": e for i, e in enumerate(errors)})[0]
    assert f"(their {text})" in warning
