"""The per-card gauges as text: what Prometheus's parser reads back equals the mirror's cards, label values are
escaped, a node's lines are rendered again only when its snapshot changes, and nodes gone are forgotten."""

from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from shared.domain.models import UNIT_MIB
from shared.domain.state import CardRecord, NodeSnapshot
from shared.store import card_metrics
from shared.store.card_metrics import FAMILIES, CardExposition

GIB = 1024 * 1024 * 1024


def card(i: int, cap: int = 96, mem: int = 0, cores: int = 0, slices: int = 0, limit: int = 16) -> CardRecord:
    return CardRecord(i, cap, mem, cap - mem, 16, cores, 16 - cores, slices, limit, "ok")


def snap(name: str, *cards: CardRecord) -> NodeSnapshot:
    return NodeSnapshot(name, 1, cards={c.index: c for c in cards})


def parsed(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text.decode()):
        assert fam.type == "gauge"
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def expected(nodes: dict[str, NodeSnapshot]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for name, sn in nodes.items():
        for c in sn.cards.values():
            labels = tuple(sorted({"node": name, "device_uuid": f"{name}-mthreads-{c.index}",
                                   "device_index": str(c.index), "device_type": "Mthreads"}.items()))
            values = {
                "mtsched_card_memory_allocated_units": c.mem_used, "mtsched_card_memory_limit_units": c.capacity,
                "mtsched_card_cores_allocated": c.cores_used, "mtsched_card_cores_limit": c.cores,
                "mtsched_card_slices": c.slices, "mtsched_card_slices_limit": c.slice_limit,
                "hami_gpu_memory_limit_bytes": c.capacity * UNIT_MIB * 1024 * 1024,
                "hami_gpu_memory_allocated_bytes": c.mem_used * UNIT_MIB * 1024 * 1024,
                "hami_gpu_shared_count": c.slices,
            }
            for metric, v in values.items():
                out[(metric, labels)] = float(v)
    return out


def test_the_parser_reads_back_every_card_of_every_node() -> None:
    nodes = {
        "s4000-a": snap("s4000-a", card(0, mem=8, cores=2, slices=1), card(1)),
        "s5000-b": snap("s5000-b", card(0, 160, 160, 16, 1, 1), card(3, 160, 32, 4, 2, 4)),
        'odd"name\\x': snap('odd"name\\x', card(0, mem=2, cores=1, slices=1)),  # escaped, and read back as it is
        "empty": snap("empty"),
    }
    text = CardExposition(lambda: nodes).render()
    assert parsed(text) == expected(nodes)
    # the line as prometheus_client wrote it (label names sorted): people grep for it
    assert ('mtsched_card_cores_limit{device_index="1",device_type="Mthreads",device_uuid="s4000-a-mthreads-1",'
            'node="s4000-a"} 16\n') in text.decode()
    assert parsed(text)[("hami_gpu_memory_limit_bytes", (("device_index", "0"), ("device_type", "Mthreads"),
                                                         ("device_uuid", "s5000-b-mthreads-0"),
                                                         ("node", "s5000-b")))] == 80 * GIB


def test_every_family_is_declared_even_without_cards() -> None:
    text = CardExposition(dict).render().decode()
    assert [f.name for f in text_string_to_metric_families(text)] == [m for m, _, _ in FAMILIES]


def test_a_node_is_rendered_again_only_when_its_snapshot_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = {n: snap(n, card(0), card(1)) for n in ("a", "b", "c")}
    calls: list[str] = []
    real = card_metrics.node_lines

    def counting(name: str, sn: NodeSnapshot) -> tuple[str, ...]:
        calls.append(name)
        return real(name, sn)

    monkeypatch.setattr(card_metrics, "node_lines", counting)
    ex = CardExposition(lambda: nodes)
    first = ex.render()
    assert sorted(calls) == ["a", "b", "c"]
    calls.clear()
    assert ex.render() == first and calls == []  # nothing changed: nothing rendered
    nodes["b"] = replace(nodes["b"], cards={0: card(0, mem=8, cores=2, slices=1), 1: card(1)})
    del nodes["c"]
    after = ex.render()
    assert calls == ["b"] and parsed(after) == expected(nodes)
    nodes["c"] = snap("c", card(0))  # back: rendered afresh, not from a stale entry
    calls.clear()
    assert parsed(ex.render()) == expected(nodes) and calls == ["c"]
