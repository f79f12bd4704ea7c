"""The card knobs in the ledger: written with the node's cards, kept through bookings and shown by
mirrors and snapshots, removed when the node stops publishing them; the slice limit they set is
judged by the reserve script (real redis-server)."""

from __future__ import annotations

from typing import Any

import pytest

from controller.node_watch import NodeWatcher
from shared.config import Config
from shared.domain.knobs import ANNOTATION, CardKnobs, KnobReport, encode_annotation
from shared.domain.node import Card, Inventory
from shared.store.ledger import Ledger, LedgerError
from tests.redis.conftest import MirrorFactory
from tests.redis.helpers import S5000
from tests.redis.test_mirror import wait_synced

pytestmark = pytest.mark.redis


def knobbed(node: str, knobs: dict[int, CardKnobs | None]) -> Inventory:
    return Inventory(node, tuple(Card(node, i, S5000, k.max_inst if k else 16, knobs=k) for i, k in knobs.items()))


async def test_knobs_travel_with_the_cards_and_survive_bookings(ledger: Ledger, mirror_factory: MirrorFactory) -> None:
    m = await mirror_factory()
    await ledger.upsert_node(knobbed("kn", {0: CardKnobs(2, 2, 3, 110), 1: None}))
    out, _ = await ledger.reserve("kn", "u1", [0], 8, 2, 1, pod="ns/a")
    assert out.ok
    await wait_synced(m, ledger)
    for snap in ((await ledger.snapshots(["kn"]))["kn"], m.nodes["kn"]):
        c0, c1 = snap.cards[0], snap.cards[1]
        assert c0.knobs == CardKnobs(2, 2, 3, 110) and (c0.slices, c0.slice_limit) == (1, 2)
        assert c1.knobs is None and c1.policy is None
        assert snap.states()[0].card.knobs == CardKnobs(2, 2, 3, 110)
    # max_inst 2: one more slice fits, the third does not (the per-card limit, judged in the script)
    assert (await ledger.reserve("kn", "u2", [0], 8, 2, 1))[0].ok
    third, _ = await ledger.reserve("kn", "u3", [0], 8, 2, 1)
    assert not third.ok and third.reason == "CardTimeSlicingExhausted"
    # the agent stops publishing: the knobs go, the usage stays
    await ledger.upsert_node(knobbed("kn", {0: None, 1: None}))
    await wait_synced(m, ledger)
    c0 = (await ledger.snapshots(["kn"]))["kn"].cards[0]
    assert c0.knobs is None and c0.policy is None and c0.slices == 2 and m.nodes["kn"].cards[0].knobs is None


@pytest.mark.parametrize("bad", [{"policy": 3}, {"time_slice": 0}, {"overcommit_ratio": 99},
                                 {"overcommit_ratio": 1.1}, {"policy": "0"}])
async def test_the_script_refuses_knobs_out_of_range(ledger: Ledger, bad: dict[str, object]) -> None:
    card = {"index": 0, "capacity": S5000, "slice_limit": 16, "health": "ok", **bad}
    with pytest.raises(LedgerError, match=r"card knobs, when given: policy 0\.\.2"):
        await ledger._call("upsert_node", "kbad", {"create": True, "cards": [card]})


class _Kube:
    """The watcher's API client: no call is expected here (no held card, no mismatch)."""

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        raise AssertionError(f"unexpected {method} {path}")


def gpu_node(name: str, max_inst: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"mthreads.com/sgpu.cores": "0-1"},
                         "annotations": {ANNOTATION: encode_annotation(KnobReport(
                             {0: CardKnobs(max_inst, 0, 1, 100), 1: CardKnobs(16, 0, 1, 100)}))}},
            "status": {"capacity": {"mthreads.com/sgpu-core": "32", "mthreads.com/sgpu-memory": "192"}}}


async def test_a_relist_that_raises_max_inst_nudges_once_the_ledger_has_it(ledger: Ledger) -> None:
    """The watch was down while a card's max_inst rose: the re-list (on_sync) nudges kube-scheduler as a
    watch event would, after the ledger holds the new limit; a node gone meanwhile leaves no baseline."""
    watcher = NodeWatcher(_Kube(), ledger, Config())  # type: ignore[arg-type]
    nudged: list[str] = []
    watcher.nudge = nudged.append
    await watcher.on_sync([gpu_node("ka", 4), gpu_node("kb", 4)])
    assert nudged == []  # the first reading is the baseline
    await watcher.on_sync([gpu_node("ka", 8)])  # kb vanished while the watch was down
    assert nudged == ["ka"]
    assert (await ledger.snapshots(["ka"]))["ka"].cards[0].slice_limit == 8
    assert set(watcher.knobs.last) == {"ka"}
    await watcher.on_sync([gpu_node("ka", 8), gpu_node("kb", 16)])  # a new kb: its knobs a baseline, not a rise,
    assert nudged == ["ka", "kb"]  # but room kube-scheduler may have turned pods away from (offers_more)
    await watcher.on_sync([gpu_node("ka", 2), gpu_node("kb", 16)])  # lower: nothing to retry
    assert nudged == ["ka", "kb"]
