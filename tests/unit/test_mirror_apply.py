"""Mirror.apply on plain feed messages: no Redis involved (apply is pure state handling)."""

from __future__ import annotations

from redis.asyncio import Redis

from shared.store.ledger import Ledger
from shared.store.mirror import Mirror


def card(mem_used: int) -> dict[str, object]:
    return {"capacity": 96, "mem_used": mem_used, "mem_free": 96 - mem_used, "cores": 16, "cores_used": 0,
            "cores_free": 16, "slices": 1 if mem_used else 0, "slice_limit": 16, "health": "ok"}


def test_every_change_installs_a_new_cards_dict() -> None:
    # The extender memoises fits per (node, seq): an edit in place would leave it answering from the old
    # usage (found by the e2e suite). Every change installs a new snapshot, with a new cards dict.
    mirror = Mirror(Ledger(Redis()))
    assert mirror.apply({"node": "n", "version": 1, "kind": "node", "full": True,
                         "cards": {"0": card(0), "1": card(0)}}) is None
    before = mirror.nodes["n"].cards
    seq = mirror.nodes["n"].seq
    assert mirror.apply({"node": "n", "version": 2, "kind": "reserve", "full": False, "cards": {"1": card(8)},
                         "uid": "u", "res": {"cards": "1", "mem": 8, "cores": 0, "slices": 1, "state": "pending",
                                             "created": 1}}) is None
    after = mirror.nodes["n"].cards
    assert after is not before and mirror.nodes["n"].seq > seq
    seq = mirror.nodes["n"].seq
    assert before[1].mem_used == 0 and after[1].mem_used == 8 and after[0] is before[0]
    assert mirror.nodes["n"].reservations["u"].cards == (1,)
    # a gap asks for a re-read and changes nothing
    assert mirror.apply({"node": "n", "version": 4, "kind": "release", "full": False, "cards": {"1": card(0)},
                         "uid": "u", "res": False}) == "n"
    assert mirror.nodes["n"].cards is after
    assert mirror.nodes["n"].seq == seq
