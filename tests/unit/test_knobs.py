"""The card knobs of /proc/sgpu_km: reading fake trees, the annotation both ways, the per-card slice limit
and its precedence, what the node agent patches, knob changes under held slices, and the card table."""

from __future__ import annotations

import dataclasses
import os
import re
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest

from controller.cards import render_table
from controller.knob_watch import KnobWatch, event_body
from controller.node_agent import NodeAgent, read_tree
from shared.config import Config, ConfigError, load_config
from shared.domain.annotations import PodUsage
from shared.domain.knobs import (
    ANNOTATION,
    CardKnobs,
    KnobChange,
    KnobError,
    KnobReport,
    build_report,
    decode_annotation,
    encode_annotation,
    held_changes,
    parse_knob,
    should_patch,
)
from shared.domain.node import MAX_INST_ANNOTATION, node_inventory
from shared.domain.state import CardRecord, NodeSnapshot

DEFAULT = {"max_inst": "16\n", "policy": "0\n", "time_slice": "1\n", "overcommit_ratio": "100\n"}


def write_card(root: Path, card: str, **knobs: str) -> None:
    d = root / card
    d.mkdir(parents=True, exist_ok=True)
    for k, v in {**DEFAULT, **knobs}.items():
        (d / k).write_text(v)


def report_of(root: Path) -> KnobReport:
    tree, error = read_tree(root)
    r = build_report(str(root), tree)
    return KnobReport(r.cards, r.unreadable, error)


# -- parsing ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("knob", "text", "value"), [
    ("max_inst", "16\n", 16), ("max_inst", "1", 1), ("policy", "2\n", 2), ("time_slice", " 5 \n", 5),
    ("overcommit_ratio", "110\n", 110), ("overcommit_ratio", "200", 200),
])
def test_a_knob_is_a_whole_number_in_range(knob: str, text: str, value: int) -> None:
    assert parse_knob("/proc/sgpu_km/0", knob, text) == value


@pytest.mark.parametrize(("knob", "text"), [
    ("max_inst", "0"), ("max_inst", "17"), ("max_inst", ""), ("max_inst", "-1"), ("max_inst", "16 17"),
    ("policy", "3"), ("policy", "performance"), ("time_slice", "0"), ("time_slice", "1.5"),
    ("overcommit_ratio", "1.1"), ("overcommit_ratio", "99"), ("overcommit_ratio", "201"), ("max_inst", "²"),
    ("max_inst", "0x10"),
])
def test_anything_else_is_an_error_naming_file_value_and_range(knob: str, text: str) -> None:
    with pytest.raises(KnobError) as e:
        parse_knob("/proc/sgpu_km/3", knob, text)
    msg = str(e.value)
    assert f"/proc/sgpu_km/3/{knob}" in msg and repr(text.strip()) in msg and ".." in msg


def test_a_fake_tree_reads_as_cards(tmp_path: Path) -> None:
    write_card(tmp_path, "0")
    write_card(tmp_path, "2", max_inst="4\n", policy="2\n", time_slice="3\n", overcommit_ratio="110\n")
    (tmp_path / "version").write_text("2.1.0\n")  # a file beside the cards is no card
    r = report_of(tmp_path)
    assert r.cards == {0: CardKnobs(16, 0, 1, 100), 2: CardKnobs(4, 2, 3, 110)}
    assert r.unreadable == {} and r.error == ""


def test_unreadable_cards_are_reported_never_guessed(tmp_path: Path) -> None:
    write_card(tmp_path, "0")
    write_card(tmp_path, "1", policy="7\n")
    write_card(tmp_path, "2")
    (tmp_path / "2" / "time_slice").unlink()
    (tmp_path / "2" / "overcommit_ratio").unlink()
    write_card(tmp_path, "gpu3")
    r = report_of(tmp_path)
    assert set(r.cards) == {0}
    assert "policy: '7' is not a whole number 0..2" in r.unreadable["1"]
    assert "missing time_slice, overcommit_ratio" in r.unreadable["2"]
    assert "'gpu3' is not a card index" in r.unreadable["gpu3"]


def test_a_file_the_agent_cannot_read_makes_its_card_unreadable(tmp_path: Path) -> None:
    write_card(tmp_path, "0")
    write_card(tmp_path, "1")
    (tmp_path / "0" / "max_inst").unlink()
    (tmp_path / "0" / "max_inst").mkdir()  # reading it fails with an OSError, whoever the reader is
    r = report_of(tmp_path)
    assert set(r.cards) == {1} and "max_inst: cannot read: not a regular file" in r.unreadable["0"]


def test_a_fifo_in_the_tree_does_not_block_the_agent(tmp_path: Path) -> None:
    """Red team: opening a FIFO blocked the agent's read for ever (each restart left one more stuck thread)."""
    write_card(tmp_path, "0")
    write_card(tmp_path, "1")
    (tmp_path / "0" / "policy").unlink()
    os.mkfifo(tmp_path / "0" / "policy")
    out: list[Any] = []
    reader = threading.Thread(target=lambda: out.append(report_of(tmp_path)), daemon=True)
    reader.start()
    reader.join(5.0)
    if reader.is_alive():  # (let the stuck reader go: opening the FIFO for writing ends its open())
        os.close(os.open(tmp_path / "0" / "policy", os.O_WRONLY | os.O_NONBLOCK))
        reader.join(5.0)
        raise AssertionError("reading the knob tree blocked on a FIFO")
    (r,) = out
    assert set(r.cards) == {1} and "policy: cannot read: not a regular file" in r.unreadable["0"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_a_file_the_agent_may_not_read_makes_its_card_unreadable(tmp_path: Path) -> None:
    write_card(tmp_path, "0")
    (tmp_path / "0" / "max_inst").chmod(0)
    r = report_of(tmp_path)
    assert r.cards == {} and "max_inst: cannot read: Permission denied" in r.unreadable["0"]


def test_a_missing_tree_is_one_error(tmp_path: Path) -> None:
    r = report_of(tmp_path / "absent")
    assert r.cards == {} and "does not exist (is the sgpu_km module loaded?)" in r.error


# -- the annotation ---------------------------------------------------------------------------------

def test_the_annotation_is_versioned_sorted_and_round_trips(tmp_path: Path) -> None:
    write_card(tmp_path, "1", overcommit_ratio="150\n")
    write_card(tmp_path, "0", max_inst="8\n")
    write_card(tmp_path, "5", max_inst="x")
    r = report_of(tmp_path)
    raw = encode_annotation(r)
    assert orjson.loads(raw)["v"] == 1
    assert raw.startswith('{"cards":{"0":{"max_inst":8,"overcommit_ratio":100,"policy":0,"time_slice":1},"1":')
    assert decode_annotation(raw) == r
    assert encode_annotation(decode_annotation(raw)) == raw  # same findings, same text: no needless patch


_K = '{"max_inst":4,"policy":0,"time_slice":1,"overcommit_ratio":100}'


@pytest.mark.parametrize(("raw", "says"), [
    ("not json", "is not JSON"),
    ("[]", "must be a JSON object"),
    ('{"v":2,"cards":{}}', "format version 2 is not 1"),
    ('{"cards":{}}', "format version None is not 1"),
    ('{"v":true,"cards":{}}', "format version True is not 1"),  # equal to 1 in Python, not the agent's
    ('{"v":1.0,"cards":{}}', "format version 1.0 is not 1"),
    ('{"v":1}', "cards must be an object"),
    ('{"v":1,"cards":{},"colour":"red"}', "unknown field(s) 'colour'"),
    ('{"v":1,"cards":{"a":{}}}', "'a' is not a card index"),
    ('{"v":1,"cards":{"0":{"max_inst":4}}}', "card 0 must have exactly max_inst, policy, time_slice"),
    ('{"v":1,"cards":{"0":{"max_inst":17,"policy":0,"time_slice":1,"overcommit_ratio":100}}}',
     "card 0 max_inst=17 is not a whole number 1..16"),
    ('{"v":1,"cards":{"0":{"max_inst":true,"policy":0,"time_slice":1,"overcommit_ratio":100}}}',
     "max_inst=True"),
    ('{"v":1,"cards":{"0":{"max_inst":4,"policy":0,"time_slice":1,"overcommit_ratio":1.1}}}',
     "overcommit_ratio=1.1 is not a whole number 100..200"),
    ('{"v":1,"cards":{},"unreadable":{"0":3}}', "unreadable must map names to strings"),
    ('{"v":1,"cards":{},"error":7}', "error must be a string"),
    # two keys naming one card: refused, never one of them silently kept
    ('{"v":1,"cards":{"0":' + _K + ',"00":' + _K + '}}', "'00' is not a card index 0..1023 (decimal, no leading"),
    ('{"v":1,"cards":{"01":' + _K + '}}', "'01' is not a card index"),
    ('{"v":1,"cards":{"+1":' + _K + '}}', "'+1' is not a card index"),
    ('{"v":1,"cards":{"0":' + _K + ',"0":' + _K + '}}', "key(s) '0' given twice"),
    ('{"v":1,"v":1,"cards":{}}', "key(s) 'v' given twice"),
    ('{"v":1,"cards":{"0":{"max_inst":NaN,"policy":0,"time_slice":1,"overcommit_ratio":100}}}', "NaN is not a"),
])
def test_a_malformed_annotation_is_an_error_naming_the_field(raw: str, says: str) -> None:
    with pytest.raises(KnobError) as e:
        decode_annotation(raw)
    assert says in str(e.value) and ANNOTATION in str(e.value)


# -- the slice limit per card -----------------------------------------------------------------------

def node(annotations: dict[str, str], cards: int = 3, label: str = "0-1-2") -> dict[str, Any]:
    return {"metadata": {"name": "gpu-1", "labels": {"mthreads.com/sgpu.cores": label},
                         "annotations": annotations},
            "status": {"capacity": {"mthreads.com/sgpu-core": str(16 * cards),
                                    "mthreads.com/sgpu-memory": str(96 * cards)}}}


def knobs_annotation(cards: dict[int, CardKnobs], unreadable: dict[str, str] | None = None) -> str:
    return encode_annotation(KnobReport(cards, unreadable or {}))


@pytest.mark.parametrize(("cluster", "node_max", "card_knobs", "limits"), [
    (16, None, {}, [16, 16, 16]),  # nothing published: the cluster default
    (8, None, {}, [8, 8, 8]),
    (8, "4", {}, [4, 4, 4]),  # the node's annotation refines the cluster default
    (8, "4", {1: CardKnobs(2, 0, 1, 100)}, [4, 2, 4]),  # the card's own max_inst refines both
    (8, None, {0: CardKnobs(16, 0, 1, 100), 2: CardKnobs(1, 2, 1, 110)}, [16, 8, 1]),  # even above them
])
def test_the_most_specific_slice_limit_wins(cluster: int, node_max: str | None, card_knobs: dict[int, CardKnobs],
                                            limits: list[int]) -> None:
    ann = {ANNOTATION: knobs_annotation(card_knobs)}
    if node_max is not None:
        ann[MAX_INST_ANNOTATION] = node_max
    inv = node_inventory(node(ann), Config(max_slices_per_card=cluster))
    assert inv.error == ""
    assert [c.max_slices for c in inv.cards] == limits
    assert [c.knobs for c in inv.cards] == [card_knobs.get(i) for i in range(3)]


def test_an_unreadable_card_keeps_the_configured_limit_and_cards_the_node_lacks_are_ignored() -> None:
    ann = {ANNOTATION: knobs_annotation({7: CardKnobs(2, 0, 1, 100)}, {"1": "max_inst: cannot read"}),
           MAX_INST_ANNOTATION: "6"}
    inv = node_inventory(node(ann), Config())
    assert [(c.index, c.max_slices, c.knobs) for c in inv.cards] == [(0, 6, None), (1, 6, None), (2, 6, None)]


def test_a_malformed_knobs_annotation_closes_the_node() -> None:
    inv = node_inventory(node({ANNOTATION: '{"v":9,"cards":{}}'}), Config())
    assert inv.cards == () and "format version 9 is not 1" in inv.error


def test_two_keys_for_one_card_close_the_node_with_the_reason() -> None:
    inv = node_inventory(node({ANNOTATION: '{"v":1,"cards":{"0":' + _K + ',"00":' + _K.replace('"max_inst":4',
                                                                                              '"max_inst":1') + '}}'}),
                         Config())
    assert inv.cards == () and "'00' is not a card index" in inv.error and ANNOTATION in inv.error


def test_a_card_directory_with_leading_zeros_is_unreadable() -> None:
    texts = {"max_inst": "4\n", "policy": "0\n", "time_slice": "1\n", "overcommit_ratio": "100\n"}
    report = build_report("/proc/sgpu_km", {"0": texts, "00": texts})
    assert set(report.cards) == {0} and "is not a card index" in report.unreadable["00"]


# -- what the agent patches ---------------------------------------------------------------------------

class FakeKube:
    """Records the agent's calls; holds one Node's annotations."""

    def __init__(self, annotations: dict[str, str] | None = None):
        self.annotations = dict(annotations or {})
        self.calls: list[str] = []

    async def get_node(self, name: str) -> dict[str, Any]:
        self.calls.append("GET")
        return {"metadata": {"name": name, "annotations": dict(self.annotations)}}

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        self.calls.append(method)
        self.annotations.update(body["metadata"]["annotations"])
        return {}


def agent(kube: FakeKube, root: Path) -> NodeAgent:
    cfg = Config(node_name="gpu-1", card_knobs_path=str(root), card_knobs_seconds=1)
    return NodeAgent(kube, cfg)  # type: ignore[arg-type]


async def test_the_agent_patches_only_when_the_value_changes(tmp_path: Path) -> None:
    write_card(tmp_path, "0")
    kube = FakeKube()
    a = agent(kube, tmp_path)
    assert await a.once() is True
    assert kube.calls == ["GET", "PATCH"]
    assert decode_annotation(kube.annotations[ANNOTATION]).cards == {0: CardKnobs(16, 0, 1, 100)}
    assert await a.once() is False and await a.once() is False
    assert kube.calls == ["GET", "PATCH"]  # unchanged: no patch, and no GET between resyncs
    write_card(tmp_path, "0", max_inst="4\n")
    assert await a.once() is True
    assert decode_annotation(kube.annotations[ANNOTATION]).cards[0].max_inst == 4
    assert a.beat() == ""


async def test_an_annotation_already_right_is_not_patched_and_a_removed_one_comes_back(tmp_path: Path) -> None:
    write_card(tmp_path, "0")
    kube = FakeKube({ANNOTATION: encode_annotation(report_of(tmp_path))})
    a = agent(kube, tmp_path)
    assert await a.once() is False and kube.calls == ["GET"]
    del kube.annotations[ANNOTATION]  # someone removed it: seen at the next resync
    for _ in range(20):
        await a.once()
    assert ANNOTATION in kube.annotations and kube.calls.count("PATCH") == 1


def test_the_agent_needs_its_node_name(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="MTSCHED_NODE_NAME"):
        NodeAgent(FakeKube(), Config(card_knobs_path=str(tmp_path)))  # type: ignore[arg-type]


def test_the_agent_settings_are_checked() -> None:
    cfg = load_config(env={"MTSCHED_NODE_NAME": "gpu-1", "MTSCHED_CARD_KNOBS_SECONDS": "5"})
    assert (cfg.node_name, cfg.card_knobs_seconds, cfg.card_knobs_path) == ("gpu-1", 5, "/proc/sgpu_km")
    with pytest.raises(ConfigError) as e:
        load_config(env={"MTSCHED_NODE_NAME": "Not_A_Node", "MTSCHED_CARD_KNOBS_SECONDS": "0",
                         "MTSCHED_CARD_KNOBS_PATH": "proc"})
    assert "nodeName" in str(e.value) and "cardKnobsSeconds: 0" in str(e.value) and "cardKnobsPath" in str(e.value)


# -- knob changes under held slices -------------------------------------------------------------------

def test_only_frozen_knobs_on_held_cards_count() -> None:
    old = {0: CardKnobs(16, 0, 1, 100), 1: CardKnobs(16, 0, 1, 100), 2: CardKnobs(16, 0, 1, 100)}
    new = {0: CardKnobs(8, 1, 1, 150), 1: CardKnobs(8, 0, 1, 100), 3: CardKnobs(1, 0, 1, 100)}
    changes = held_changes(old, new, {0: ["ns/a"], 2: ["ns/b"], 3: ["ns/c"]})
    # card 1 is idle (the vendor allows it), card 2 vanished, card 3 is new, overcommit is not frozen
    assert changes == [KnobChange(0, "max_inst", 16, 8, ("ns/a",)), KnobChange(0, "policy", 0, 1, ("ns/a",))]
    assert "drain the card first" in changes[0].message("gpu-1") and "gpu-1-mthreads-0" in changes[0].message("gpu-1")


async def test_the_watcher_reports_a_change_on_a_held_card_once_per_node_version() -> None:
    posted: list[dict[str, Any]] = []

    class Kube:
        async def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
            posted.append(body)
            return {}

    watch = KnobWatch(Kube(), events=True)  # type: ignore[arg-type]
    held = {"u1": (PodUsage("gpu-1", (1,), 8, 2, 1), "ns/a")}
    asked: list[int] = []

    def holders() -> dict[str, tuple[PodUsage, str]]:
        asked.append(1)
        return held

    first = node({ANNOTATION: knobs_annotation({1: CardKnobs(16, 0, 1, 100)})})
    assert await watch.observe(first, node_inventory(first, Config()), holders) == ([], False)  # the baseline
    same = node({ANNOTATION: knobs_annotation({1: CardKnobs(16, 0, 1, 100)})})
    assert await watch.observe(same, node_inventory(same, Config()), holders) == ([], False)
    assert asked == []  # no knob changed: the pods are not even looked at
    changed = node({ANNOTATION: knobs_annotation({1: CardKnobs(4, 0, 1, 100)})})
    changed["metadata"]["resourceVersion"] = "42"
    out, raised = await watch.observe(changed, node_inventory(changed, Config()), holders)
    assert [(c.card, c.knob, c.old, c.new) for c in out] == [(1, "max_inst", 16, 4)] and not raised
    await watch.flush()  # (sent beside the node stream)
    assert posted[0]["reason"] == "CardKnobsChangedWhileHeld" and posted[0]["type"] == "Warning"
    assert posted[0]["involvedObject"]["kind"] == "Node" and "ns/a" in posted[0]["message"]
    # two replicas name the same change alike, so the API server keeps one event
    assert event_body(changed, out[0], "x")["metadata"]["name"] == posted[0]["metadata"]["name"]
    up = node({ANNOTATION: knobs_annotation({1: CardKnobs(8, 0, 1, 100)})})
    out, raised = await watch.observe(up, node_inventory(up, Config()), holders)
    assert raised and [(c.old, c.new) for c in out] == [(4, 8)]  # more slices: kube-scheduler gets nudged


# -- the card table -----------------------------------------------------------------------------------

def test_the_card_table_shows_policy_and_overcommit() -> None:
    snap = NodeSnapshot("gpu-1", 3, cards={
        0: CardRecord(0, 96, 8, 88, 16, 2, 14, 1, 4, "ok", 2, 3, 110),
        1: CardRecord(1, 96, 0, 96, 16, 0, 16, 0, 16, "ok"),
    })
    lines = render_table({"gpu-1": snap}).splitlines()
    assert "POLICY" in lines[0] and "OVERCOMMIT" in lines[0]
    assert "strong, 3 ms" in lines[1] and "110%" in lines[1] and "1/4" in lines[1]
    assert "8/96" in lines[1]  # memory total stays the card's physical memory, overcommit or not
    assert re.split(r"\s{2,}", lines[2])[6:8] == ["-", "-"]
    # a node not compared since Redis's process changed says so on each of its cards
    lines = render_table({"gpu-1": dataclasses.replace(snap, verified=False)}).splitlines()
    assert all(re.split(r"\s{2,}", line)[8] == "ok, unverified" for line in lines[1:]), lines


def test_should_patch_compares_the_whole_value() -> None:
    value = knobs_annotation({0: CardKnobs(16, 0, 1, 100)})
    assert should_patch(None, value) and should_patch(value.replace("100", "110"), value)
    assert not should_patch(value, value)
