"""Red team (outputs): a log line or an event that lists every node a call or a list named is as long as the
fleet. The extender's preempt verb logged one line per call naming every candidate node with its reason, a
node's error (up to 2 KiB, its kubelet's text) or one reason per card, and built the same text for its event
(then cut to 1 KiB): kube-scheduler sends up to 10,000 candidates, and a pod creator with a priority above other
pods makes it call again and again. The node watcher's first list logged every mismatched node with its error in
one line. And a pod that bypassed admission with a problem in each of its 1,024 containers had all of them in the
filter's text, once per node of the call. Each now names the first few and counts the rest
(shared.domain.shapes.listed)."""

from __future__ import annotations

import asyncio
import logging

import orjson
import pytest

from controller.mismatch import MismatchReporter
from controller.preempt import EVENT_LISTED, Preemption
from shared.domain.annotations import ALLOCATED, AnnotationError, usage_from_annotations
from shared.domain.node import Inventory
from shared.domain.shapes import LISTED, LISTED_CHARS, listed
from shared.domain.state import CardRecord, NodeSnapshot
from tests.unit._k8s import CORE, MEM, VGPU, cfg
from tests.unit._servers import FakeKube, extender
from tests.unit.test_preempt import meta, preemptor

NODES = 300
ERROR = "mthreads.com/sgpu-core capacity 17 is not a multiple of 16 " + "x" * 2000  # as long as node errors go


async def test_a_preempt_call_over_many_nodes_logs_and_posts_a_bounded_text(
        caplog: pytest.LogCaptureFixture) -> None:
    kube = FakeKube()
    ext = extender(kube=kube)
    args: dict[str, object] = {}
    for i in range(NODES):
        card = CardRecord(0, 96, 0, 96, 16, 0, 16, 0, 16, "ok")
        ext.mirror.put(NodeSnapshot(f"n{i:03d}", 1, ERROR, {0: card}, {}))
        args.update(meta(f"n{i:03d}", f"v{i}"))
    with caplog.at_level(logging.INFO, logger="mtsched.preempt"):
        out = await Preemption(ext).preempt({"Pod": preemptor(), "NodeNameToMetaVictims": args})
    assert out == {"NodeNameToMetaVictims": {}}
    (line,) = [r.getMessage() for r in caplog.records if r.name == "mtsched.preempt"]
    assert len(line) < 4096, len(line)  # was 634,000 characters, one line per call
    assert f"0 of {NODES} nodes kept" in line and "n000: mthreads.com/sgpu-core capacity 17" in line
    assert f"and {NODES - LISTED} more" in line
    await asyncio.sleep(0.01)
    ((reason, message),) = kube.events
    assert reason == "PreemptionNotHelpful" and message.endswith(f"; and {NODES - EVENT_LISTED[0]} more"), message
    assert len(message) <= 1024  # said whole: the count is not what the event's cut takes off


def test_the_first_list_of_mismatched_nodes_is_one_bounded_line(caplog: pytest.LogCaptureFixture) -> None:
    r = MismatchReporter(None, cfg((96,)))
    for i in range(NODES):
        r.observe(f"n{i:03d}", {"metadata": {"uid": f"u{i}"}}, Inventory(f"n{i:03d}", error=ERROR, problem="capacity"))
    with caplog.at_level(logging.WARNING, logger="mtsched.mismatch"):
        r.synced({f"n{i:03d}" for i in range(NODES)})
    (line,) = [rec.getMessage() for rec in caplog.records if "report sliced cards but offer none" in rec.getMessage()]
    assert len(line) < 4096, len(line)  # was 620,000 characters
    assert line.startswith(f"{NODES} node(s)") and "n000 (capacity: mthreads.com/sgpu-core" in line
    assert f"and {NODES - LISTED} more" in line


def test_listed() -> None:
    assert listed([]) == ""
    assert listed(["a", "b"]) == "a; b"
    assert listed(["a", "b"], sep=", ") == "a, b"
    many = [f"n{i}" for i in range(LISTED + 5)]
    assert listed(many) == "; ".join(many[:LISTED]) + "; and 5 more"
    long = "y" * (LISTED_CHARS + 100)
    assert listed([long]) == "y" * LISTED_CHARS + f"... ({LISTED_CHARS + 100} characters)"


def bad_pod(containers: int = 1024) -> dict[str, object]:
    """A pod that bypassed admission (the filter fails it closed) with one problem per container."""
    cs = [{"name": f"c{i}", "resources": {"limits": {VGPU: "1", MEM: "2", CORE: "17"}}} for i in range(containers)]
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"schedulerName": "hami-scheduler", "containers": cs}}


def test_the_filter_answers_a_bounded_text_per_node_for_a_pod_with_many_problems() -> None:
    """The filter's text for a pod it cannot read goes to every node of the call: with every problem of 1,024
    containers it was 63 KB a node, an answer of 327 MB for 5,000 nodes (12.7 MB for these 200), built in the
    extender and decoded by kube-scheduler on every try of the pod."""
    names = [f"node-{i}" for i in range(200)]
    out = extender().filter({"Pod": bad_pod(), "NodeNames": names})
    assert out["NodeNames"] == [] and set(out["FailedAndUnresolvableNodes"]) == set(names)
    (text,) = set(out["FailedAndUnresolvableNodes"].values())
    assert len(text) <= 500, len(text)
    assert text.startswith('container "c0": mthreads.com/sgpu-core=17 is outside 1..16; container "c1"'), text
    assert text.endswith("; and 1022 more"), text
    assert len(orjson.dumps(out)) < 200 * 600


async def test_a_preempt_call_for_a_pod_with_many_problems_logs_a_bounded_line(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="mtsched.preempt"):
        out = await Preemption(extender()).preempt({"Pod": bad_pod(), "NodeNameToMetaVictims": meta("s4k", "v")})
    assert out == {"NodeNameToMetaVictims": {}}
    (line,) = [r.getMessage() for r in caplog.records if r.name == "mtsched.preempt"]
    assert len(line) < 4096 and line.endswith(f"; and {1024 - LISTED} more"), line[-200:]


@pytest.mark.parametrize("record", [
    "x" * 262_000,  # no closing ';'
    "y" * 262_000 + ";",  # a container entry without ':'
    "z" * 262_000 + ":;",  # a device entry of one field
    "\x1b[2J" + "n" * 262_000 + "-mthreads-0,Mthreads,1024,1:;",  # a device of another node
    "n1-mthreads-0,Mthreads,1024,1" + "9" * 262_000 + ":;",  # a number too long
])
def test_an_undecodable_record_is_quoted_short(record: str) -> None:
    """What a pod's allocation record says wrong is logged by the pod watcher and by the reconciler's rebuild (which
    logged the whole text: the record quoted in full, up to 1 MiB a pod once escaped). Whoever may annotate the
    pod chooses it."""
    pod = {"metadata": {"annotations": {ALLOCATED: record}}, "spec": {"nodeName": "n1", "containers": [{"name": "c"}]}}
    with pytest.raises(AnnotationError) as e:
        usage_from_annotations(pod)
    text = str(e.value)
    assert len(text) < 400 and text.isprintable(), text[:400]
    assert "characters)" in text  # how long it was, as describe() says it
