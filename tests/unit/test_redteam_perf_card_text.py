"""Red team of the per-card gauges rendered as text (shared/store/card_metrics.py, shared/serving/metrics.py):
odd and huge node names, a node renamed / removed / re-added between scrapes, the whole /metrics answer
(registry then cards) read by Prometheus's parser with every family once and contiguous, the content type,
and the roles that register no card gauges."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import replace

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from shared.domain.state import CardRecord, NodeSnapshot
from shared.serving import metrics
from shared.store.card_metrics import FAMILIES, CardExposition
from tests.unit.test_card_exposition import expected

NAMES = [m for m, _, _ in FAMILIES]


def card(i: int, mem: int = 0) -> CardRecord:
    return CardRecord(i, 96, mem, 96 - mem, 16, 1, 15, 1, 16, "ok")


def snap(name: str, *cards: CardRecord) -> NodeSnapshot:
    return NodeSnapshot(name, 1, cards={c.index: c for c in cards})


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in out, key  # a sample twice: a stale or duplicated line
            out[key] = s.value
    return out


def strict(text: str) -> None:
    """What Prometheus's own parser refuses and prometheus_client's lets by: a family's TYPE twice, a sample
    after another family started (a family split), a sample before its TYPE."""
    typed = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert [n for n, k in Counter(typed).items() if k > 1] == []
    current, closed = "", set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            closed.add(current)
            current = line.split()[2]
            assert current not in closed
        elif line and not line.startswith("#"):
            name = line.split("{")[0].split(" ")[0]
            base = next((f for f in (current,) if name == f or name.startswith(f + "_")), None)
            assert base is not None, (name, current)


def values_of(nodes: dict[str, NodeSnapshot]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The memory-allocated samples the cards imply (test_card_exposition.expected, one family)."""
    return {k: v for k, v in expected(nodes).items() if k[0] == "mtsched_card_memory_allocated_units"}


ODD = ['a,b="c"}', "end\\", "\\", "new\nline", '"', "ünï-çødé", "{x=\"y\"}", "sp ace", "tab\tx", "x" * 10_000,
       "\\n", '\\"']


@pytest.mark.parametrize("name", ODD)
def test_an_odd_or_huge_node_name_reads_back_as_it_is(name: str) -> None:
    nodes = {name: snap(name, card(0, 8), card(1)), "plain": snap("plain", card(0))}
    text = CardExposition(lambda: nodes).render().decode()
    strict(text)
    got = {k: v for k, v in samples(text).items() if k[0] == "mtsched_card_memory_allocated_units"}
    assert got == values_of(nodes)


def test_a_node_renamed_removed_or_readded_between_scrapes_leaves_no_stale_line() -> None:
    nodes = {"a": snap("a", card(0, 8)), "b": snap("b", card(0, 16))}
    ex = CardExposition(lambda: nodes)
    ex.render()
    nodes["c"] = nodes.pop("a")  # the same snapshot (same seq) under another name
    assert samples(ex.render().decode()).keys() >= values_of(nodes).keys()
    assert {k[1] for k in samples(ex.render().decode())} == {k[1] for k in values_of(nodes)}
    old_b = nodes.pop("b")
    ex.render()
    nodes["b"] = replace(old_b, cards={0: card(0, 32)})  # back, changed, with no scrape in between: new seq
    text = ex.render().decode()
    got = {k: v for k, v in samples(text).items() if k[0] == "mtsched_card_memory_allocated_units"}
    assert got == values_of(nodes)
    nodes["b"] = old_b  # the older snapshot object again: its own lines, not the cached newer ones
    got = {k: v for k, v in samples(ex.render().decode()).items() if k[0] == "mtsched_card_memory_allocated_units"}
    assert got == values_of(nodes)
    nodes.clear()
    text = ex.render().decode()
    assert samples(text) == {} and [f.name for f in text_string_to_metric_families(text)] == NAMES
    assert ex._cache == {}  # bounded: forgotten


def test_the_whole_answer_registry_then_cards_has_every_family_once(monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = {"n1": snap("n1", card(0, 8), card(1)), "n2": snap("n2")}
    monkeypatch.setattr(metrics, "_EXPOSITIONS", [CardExposition(lambda: nodes).render])
    text = metrics.exposition().decode()
    strict(text)
    names = [f.name for f in text_string_to_metric_families(text)]
    assert len(names) == len(set(names)) and all(n in names for n in NAMES)
    registry = {f.name for f in text_string_to_metric_families(generate_latest(REGISTRY).decode())}
    assert registry.isdisjoint(NAMES)
    assert {k: v for k, v in samples(text).items() if k[0] == "mtsched_card_memory_allocated_units"} \
        == values_of(nodes)


def test_a_role_without_card_gauges_answers_the_registry_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "_EXPOSITIONS", [])
    text = metrics.exposition().decode()
    strict(text)
    names = {f.name for f in text_string_to_metric_families(text)}
    assert names.isdisjoint(NAMES) and "mtsched_ready" in names


def test_the_handler_answers_the_text_format_s_content_type(monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = {"n1": snap("n1", card(0, 8))}
    monkeypatch.setattr(metrics, "_EXPOSITIONS", [CardExposition(lambda: nodes).render])

    async def scrape() -> tuple[str, str]:
        app = web.Application()
        app.router.add_get("/metrics", metrics.metrics_handler)
        async with TestClient(TestServer(app)) as client:
            resp = await client.get("/metrics")
            return resp.headers["Content-Type"], await resp.text()

    content_type, body = asyncio.run(scrape())
    assert content_type == CONTENT_TYPE_LATEST
    assert content_type.startswith("text/plain; version=")
    strict(body)
    assert samples(body)  # read back



def test_a_second_mirror_in_one_process_is_refused_not_declared_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """A second mirror's block would declare every card family twice, which Prometheus refuses for the whole
    scrape; prometheus_client's registry raised at the second collector, and so does register_mirror now."""
    from shared.store import card_metrics

    nodes = {"n1": snap("n1", card(0))}

    class M:
        def __init__(self) -> None:
            self.nodes = nodes

    monkeypatch.setattr(metrics, "_EXPOSITIONS", [])
    monkeypatch.setattr(card_metrics, "_registered", set())
    first, second = M(), M()
    card_metrics.register_mirror(first)  # type: ignore[arg-type]
    card_metrics.register_mirror(first)  # type: ignore[arg-type]  # the same mirror again: nothing added
    with pytest.raises(ValueError, match="another mirror"):
        card_metrics.register_mirror(second)  # type: ignore[arg-type]
    assert len(metrics._EXPOSITIONS) == 1
    text = metrics.exposition().decode()
    strict(text)
    assert {k: v for k, v in samples(text).items() if k[0] == "mtsched_card_memory_allocated_units"} \
        == values_of(nodes)
