"""The extender's standing ranking (controller/ranking.py) against the order computed anew per call: for
random mirrors changed by random feed messages, puts, removals and resyncs, with random candidates and
bookings in flight, `best_first` yields exactly `ranked` over the candidates' fills (what the filter did
before it kept the ranking)."""

from __future__ import annotations

import random

import pytest
from redis.asyncio import Redis

from controller.ranking import Ranking
from shared.domain.fit import node_score
from shared.domain.request import ContainerShare, Mode, SliceRequest
from shared.domain.state import CardRecord, NodeSnapshot
from shared.domain.topk import ranked
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.unit.test_topk import fills


def record(index: int, rng: random.Random) -> CardRecord:
    cap = rng.choice((96, 160))
    mem = rng.choice((0, 0, 8, 32, cap))  # ties on purpose: the order breaks them by name
    cores = 16 if mem == cap else rng.choice((0, 2, 4))
    return CardRecord(index, cap, mem, cap - mem, 16, cores, 16 - cores, 1 if mem else 0, 16, "ok")


def snapshot(name: str, version: int, rng: random.Random) -> NodeSnapshot:
    return NodeSnapshot(name, version, cards={i: record(i, rng) for i in range(rng.choice((1, 2, 4)))})


def message(snap: NodeSnapshot, version: int, rng: random.Random) -> dict[str, object]:
    cards = {str(i): {"capacity": c.capacity, "mem_used": c.mem_used, "mem_free": c.mem_free, "cores": c.cores,
                      "cores_used": c.cores_used, "cores_free": c.cores_free, "slices": c.slices,
                      "slice_limit": c.slice_limit, "health": c.health}
             for i, c in ((i, record(i, rng)) for i in snap.cards)}
    return {"node": snap.node, "version": version, "kind": "reserve", "full": True, "cards": cards}


HELD = SliceRequest(Mode.SLICE, 1, 8, 2, 1, None, (ContainerShare("c", False, 8, 2),))


@pytest.mark.parametrize("seed", range(40))
def test_best_first_equals_ranking_the_candidates_anew(seed: int) -> None:
    rng = random.Random(seed)
    mirror = Mirror(Ledger(Redis()))
    names = [f"n{i:02d}" for i in range(rng.randint(1, 30))]
    for n in names[: len(names) // 2]:  # some nodes before the ranking exists, some after
        mirror.put(snapshot(n, 1, rng))
    ranking = Ranking(mirror)
    for n in names[len(names) // 2:]:
        mirror.put(snapshot(n, 1, rng))
    for _ in range(60):
        step = rng.random()
        node = rng.choice(names)
        cur = mirror.nodes.get(node)
        if step < 0.5 and cur is not None:  # a feed message: the next version, new card usage
            assert mirror.apply(message(cur, cur.version + 1, rng)) is None
        elif step < 0.65:
            mirror.apply({"node": node, "version": 9, "kind": "removed"})
        elif step < 0.8:
            mirror.put(snapshot(node, 1, rng))
        elif step < 0.9:  # a resync that drops some nodes and re-reads others
            mirror.replace_all({n: (s if rng.random() < 0.5 else snapshot(n, s.version, rng))
                                for n, s in mirror.nodes.items() if rng.random() < 0.8})
        candidates = rng.sample([*names, "ghost"], rng.randint(0, len(names) + 1))
        held = {n: {"u": (HELD, (0,))} for n in candidates
                if n in mirror.nodes and mirror.nodes[n].cards and rng.random() < 0.2}
        for policy in ("binpack", "spread"):
            want = list(ranked(fills(mirror, candidates, held), policy))
            assert list(ranking.best_first(candidates, policy, held)) == want
    assert len(ranking) == len(mirror.nodes)


@pytest.mark.parametrize("seed", range(200))
def test_a_snapshots_fill_is_node_score_of_its_card_states(seed: int) -> None:
    """NodeSnapshot.fill adds the records' totals without building CardStates (so that ranking every node keeps
    no three objects per card alive); it must be exactly node_score of the states fit() sees, removed cards
    left out as they are there, including odd slice limits, knobs and nodes with no usable card."""
    rng = random.Random(seed)
    cards = {}
    for i in range(rng.choice((0, 1, 3, 8))):
        cap = rng.choice((96, 160))
        mem, cores, limit = rng.randint(0, cap), rng.randint(0, 16), rng.randint(1, 16)
        health = rng.choice(("ok", "ok", "cordoned", "unhealthy", "removed"))
        knobs = (rng.randint(0, 2), rng.choice((1, 5)), rng.choice((100, 150))) if rng.random() < 0.3 else (None,) * 3
        cards[i] = CardRecord(i, cap, mem, cap - mem, 16, cores, 16 - cores, rng.randint(0, limit), limit, health,
                              *knobs)
    snap = NodeSnapshot("n", 1, cards=cards)
    fill = snap.fill
    assert "_states" not in snap.__dict__  # fill built no CardState
    assert fill == node_score(snap.states())  # exact: the same integers divided the same way
