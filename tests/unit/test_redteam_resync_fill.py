"""Red team of 038fef1, pure: NodeSnapshot.fill (now fill_of over the records) on a card the ledger reads as
damaged. _lib.lua `num` reads a damaged or missing hash field as 0 and every script keeps working ("fails
closed until the reconciler rewrites the node"), but fill divides by the node's slice, core and memory
totals: a node whose every card reads slice_limit 0 raises ZeroDivisionError in Ranking.changed, i.e. in
Mirror._notify, out of Mirror.apply (Mirror._handle does not catch it), so the extender's mirror task dies
on every message for that node. Pre-existing (node_score(states()) divided the same way before 038fef1,
and CardState.score does in fit()). Now a dimension with no total counts as full (shared/domain/fit.py share)."""

from __future__ import annotations

from redis.asyncio import Redis

from controller.ranking import Ranking
from shared.domain.state import CardRecord, NodeSnapshot
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror

CARD = {"capacity": 96, "mem_used": 0, "mem_free": 96, "cores": 16, "cores_used": 0, "cores_free": 16,
        "slices": 0, "slice_limit": 16, "health": "ok"}


def test_a_feed_message_with_a_damaged_card_does_not_crash_the_mirror() -> None:
    mirror = Mirror(Ledger(Redis()))
    ranking = Ranking(mirror)
    mirror.put(NodeSnapshot("n1", 1, cards={0: CardRecord.from_json(0, CARD)}))
    damaged = {**CARD, "slice_limit": 0}  # as snapshot.lua / the feed send a damaged field
    assert mirror.apply({"node": "n1", "version": 2, "kind": "node", "full": True, "cards": {"0": damaged}}) is None
    assert mirror.nodes["n1"].version == 2 and len(ranking) == 1


def test_a_damaged_card_is_full_for_the_fill_and_the_fit() -> None:
    """The fill and fit() over a card with no slots, cores or memory: no division by zero, the card counts as
    full in that dimension, and fit() refuses it."""
    from shared.domain.fit import fit, node_score
    from shared.domain.request import ContainerShare, Mode, SliceRequest

    for field in ("slice_limit", "cores", "capacity"):
        snap = NodeSnapshot("n1", 1, cards={0: CardRecord.from_json(0, {**CARD, field: 0})})
        assert snap.fill == node_score(snap.states()) == 10.0  # one of three dimensions full, the others empty
        req = SliceRequest(Mode.SLICE, 1, 8, 2, 1, None, (ContainerShare("c", False, 8, 2),))
        assert not fit(snap.states(), req, {}, "binpack").cards
