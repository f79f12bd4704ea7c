"""Red team of the node agent's card knobs (what a compromised node can write, and what the watchers make of it).
Each test failed on the code before the fixes: a repeated key decoded in quadratic time (one node's annotation held
the watcher's loop 1.7 s per Node event; refused now in one pass, and the size limit counts bytes), the agent's own
annotation for 1024 cards was refused by the scheduler, a rise of a card's slice limit nudged nobody unless two
knob readings showed it, a change made through an unreadable or deleted state went unreported, and a node
flipping its knobs posted an event per flip, knob and card."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from controller.knob_watch import KnobWatch
from shared.config import Config
from shared.domain.annotations import PodUsage
from shared.domain.knobs import (
    ANNOTATION,
    MAX_ANNOTATION_BYTES,
    CardKnobs,
    KnobError,
    KnobReport,
    build_report,
    decode_annotation,
    encode_annotation,
)
from shared.domain.node import node_inventory
from tests.unit._servers import PostingKube

DEFAULT = {"max_inst": "16\n", "policy": "0\n", "time_slice": "1\n", "overcommit_ratio": "100\n"}
HELD = {"u1": (PodUsage("gpu-1", (0,), 8, 1, 1), "ns/a")}


def node(annotations: dict[str, str], cards: int = 3, label: str = "0-1-2", rv: str = "1") -> dict[str, Any]:
    return {"metadata": {"name": "gpu-1", "resourceVersion": rv, "labels": {"mthreads.com/sgpu.cores": label},
                         "annotations": annotations},
            "status": {"capacity": {"mthreads.com/sgpu-core": str(16 * cards),
                                    "mthreads.com/sgpu-memory": str(96 * cards)}}}


def ann(cards: dict[int, CardKnobs]) -> str:
    return encode_annotation(KnobReport(cards, {}))


def test_a_repeated_key_among_many_is_refused_naming_it() -> None:
    raw = '{"v":1,"x":{"a":0,"a":0,' + ",".join(f'"k{i}":0' for i in range(10000)) + "}}"
    with pytest.raises(KnobError, match="key\\(s\\) 'a' given twice"):
        decode_annotation(raw)


def test_the_size_limit_counts_bytes() -> None:
    raw = '{"v":1,"cards":{},"error":"' + "\u4e00" * (MAX_ANNOTATION_BYTES // 3 + 10) + '"}'
    assert len(raw) < MAX_ANNOTATION_BYTES < len(raw.encode())
    with pytest.raises(KnobError, match="longer than"):
        decode_annotation(raw)


def test_1024_cards_fit_the_annotation() -> None:
    tree = {str(i): {"max_inst": "16\n", "policy": "2\n", "time_slice": "100\n", "overcommit_ratio": "200\n"}
            for i in range(1024)}
    raw = encode_annotation(build_report("/proc/sgpu_km", tree))
    assert len(decode_annotation(raw).cards) == 1024


@pytest.mark.parametrize(("before", "after"), [
    ({ANNOTATION: ann({0: CardKnobs(1, 0, 1, 100)})}, {}),  # the annotation deleted: the cluster's 16 applies
    ({"mtsched.io/max-inst": "2"}, {"mtsched.io/max-inst": "2", ANNOTATION: ann({0: CardKnobs(16, 0, 1, 100)})}),
])
async def test_any_rise_of_a_cards_slice_limit_nudges(before: dict[str, str], after: dict[str, str]) -> None:
    watch = KnobWatch(PostingKube(), events=True)  # type: ignore[arg-type]
    first, second = node(before), node(after, rv="2")
    inv1, inv2 = node_inventory(first, Config()), node_inventory(second, Config())
    assert inv1.cards[0].max_slices < inv2.cards[0].max_slices
    await watch.observe(first, inv1, lambda: HELD)
    _, raised = await watch.observe(second, inv2, lambda: HELD)
    assert raised
    _, raised = await watch.observe(first, inv1, lambda: HELD)
    assert not raised  # (lowered)


async def test_a_change_through_an_unreadable_state_is_reported() -> None:
    watch = KnobWatch(PostingKube(), events=True)  # type: ignore[arg-type]
    steps = [ann({0: CardKnobs(16, 0, 1, 100)}),
             encode_annotation(KnobReport({}, {"0": "/proc/sgpu_km/0: missing policy"})),
             ann({0: CardKnobs(1, 2, 5, 100)})]
    changes = []
    for rv, a in enumerate(steps):
        n = node({ANNOTATION: a}, rv=str(rv))
        out, _ = await watch.observe(n, node_inventory(n, Config()), lambda: HELD)
        changes += out
    assert {(c.knob, c.old, c.new) for c in changes} == {("max_inst", 16, 1), ("policy", 0, 2), ("time_slice", 1, 5)}


async def test_flapping_knobs_log_and_post_once_a_minute_per_node(caplog: pytest.LogCaptureFixture) -> None:
    """The changes within a minute after an event are reported together when it ends: one line, one event."""
    kube = PostingKube()
    now = [0.0]
    slept: list[float] = []

    async def sleep(d: float) -> None:
        slept.append(d)
        now[0] += d

    watch = KnobWatch(kube, events=True, clock=lambda: now[0], sleep=sleep)  # type: ignore[arg-type]
    held = {f"u{c}": (PodUsage("gpu-1", (c,), 8, 1, 1), f"ns/p{c}") for c in range(3)}
    changes = 0
    caplog.set_level(logging.WARNING, "mtsched.knobs")
    for i in range(100):  # 100 patches of its own annotation by a compromised node agent
        k = CardKnobs(16, 0, 1, 100) if i % 2 else CardKnobs(1, 2, 7, 100)
        n = node({ANNOTATION: ann({c: k for c in range(3)})}, rv=str(i))
        out, _ = await watch.observe(n, node_inventory(n, Config()), lambda: held)
        changes += len(out)
        now[0] += 0.1
    await watch.flush()
    assert changes == 99 * 3 * 3  # every change counted ...
    assert len(kube.posted) == 2 and len(caplog.records) == 2  # ... one line and one event, then the rest's
    assert "and 8 more change(s)" in kube.posted[0]["message"]
    assert f"and {99 * 9 - 9 - 1} more change(s)" in kube.posted[1]["message"]
    assert len(slept) == 1


async def test_a_change_inside_the_minute_gets_its_event_when_it_ends() -> None:
    kube = PostingKube()
    now = [0.0]
    watch = KnobWatch(kube, events=True, clock=lambda: now[0], sleep=lambda d: asyncio.sleep(0))  # type: ignore[arg-type]
    held = {"u0": (PodUsage("gpu-1", (0,), 8, 1, 1), "ns/p0"), "u1": (PodUsage("gpu-1", (1,), 8, 1, 1), "ns/p1")}
    steps = [{0: CardKnobs(16, 0, 1, 100), 1: CardKnobs(16, 0, 1, 100)},
             {0: CardKnobs(16, 2, 1, 100), 1: CardKnobs(16, 0, 1, 100)},  # t=0: card 0's policy
             {0: CardKnobs(16, 2, 1, 100), 1: CardKnobs(1, 0, 1, 100)}]  # t=30: card 1's max_inst, within it
    for i, cards in enumerate(steps):
        n = node({ANNOTATION: ann(cards)}, rv=str(i))
        await watch.observe(n, node_inventory(n, Config()), lambda: held)
        now[0] = 30.0 * i
    await watch.flush()
    assert [p["message"].split(":")[0] for p in kube.posted] == ["card gpu-1-mthreads-0", "card gpu-1-mthreads-1"]


async def test_a_node_offering_cards_again_nudges() -> None:
    watch = KnobWatch(PostingKube(), events=True)  # type: ignore[arg-type]
    good = node({ANNOTATION: ann({0: CardKnobs(16, 0, 1, 100)})})
    bad = node({ANNOTATION: "{not json"}, rv="2")
    await watch.observe(good, node_inventory(good, Config()), lambda: HELD)
    assert node_inventory(bad, Config()).error
    assert await watch.observe(bad, node_inventory(bad, Config()), lambda: HELD) == ([], False)
    _, raised = await watch.observe(good, node_inventory(good, Config()), lambda: HELD)
    assert raised  # (its pods waited while it offered nothing)
    _, raised = await watch.observe(good, node_inventory(good, Config()), lambda: HELD)
    assert not raised
