"""Mirror.apply on plain feed messages: no Redis involved (apply is pure state handling)."""

from __future__ import annotations

from typing import cast

from redis.asyncio import Redis

from shared.domain.state import CardRecord, NodeSnapshot
from shared.store.ledger import Ledger, Reread
from shared.store.mirror import Mirror


def card(mem_used: int) -> dict[str, object]:
    return {"capacity": 96, "mem_used": mem_used, "mem_free": 96 - mem_used, "cores": 16, "cores_used": 0,
            "cores_free": 16, "slices": 1 if mem_used else 0, "slice_limit": 16, "health": "ok"}


def new_node(node: str, cards: dict[str, dict[str, object]], error: str = "") -> NodeSnapshot:
    """A node's first write as the mirror reads it: a message of a node it lacks is not applied but read (it may be
    another database's ledger's, tests/redis/test_redteam_day2_shared_feed.py)."""
    return NodeSnapshot(node, 1, error, {int(k): CardRecord.from_json(int(k), v) for k, v in cards.items()})


def test_a_node_the_mirror_lacks_is_read_even_at_its_first_write() -> None:
    mirror = Mirror(Ledger(Redis()))
    assert mirror.apply({"node": "n", "version": 1, "kind": "node", "full": True, "cards": {"0": card(0)}}) == "n"
    assert mirror.nodes == {}


def test_every_change_installs_a_new_cards_dict() -> None:
    # The extender memoises fits per (node, seq): an edit in place would leave it answering from the old
    # usage (found by the e2e suite). Every change installs a new snapshot, with a new cards dict.
    mirror = Mirror(Ledger(Redis()))
    mirror.put(new_node("n", {"0": card(0), "1": card(0)}))
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


def _scan(mirror: Mirror) -> tuple[set[int], dict[str, str]]:
    """capacities() and mismatched() by scanning every card, as they were computed before `_views`."""
    from shared.domain.node import mismatch_kind

    caps = {c.capacity for s in mirror.nodes.values() if not s.error for c in s.cards.values()
            if c.health != "removed"}
    return caps, {n: s.error for n, s in mirror.nodes.items() if mismatch_kind(s.error)}


class _Ledger:
    """What Mirror.resync reads: the node names and their snapshots (here: the mirror's own, less some)."""

    def __init__(self) -> None:
        self.snaps: dict[str, object] = {}
        self.on_moving: list[object] = []  # (Mirror registers itself)
        self.redis = Redis(port=1)  # the mirror's subscriber: never connected here

    def forget(self, node: str, uid: str | None = None) -> None:  # (Ledger's hints of a node's keys: none here)
        pass

    def known_nodes(self) -> set[str]:
        return set()

    async def nodes(self) -> list[str]:
        return list(self.snaps)

    async def snapshots(self, names: list[str]) -> dict[str, object]:
        return {n: self.snaps[n] for n in names}

    async def heads(self, names: list[str], isolate: bool = False) -> dict[str, tuple[int, str]]:
        return {n: (s.version, s.stamp) for n, s in cast(dict[str, NodeSnapshot], self.snaps).items() if n in names}

    async def reread(self, names: list[str], previous: dict[str, int],
                  isolate: bool = False, apart: object = ()) -> Reread:
        return Reread(cast(dict[str, NodeSnapshot], await self.snapshots(names)), set(), {})  # all decoded


async def test_the_derived_views_follow_every_change_of_error_and_cards_and_only_those() -> None:
    """capacities() and mismatched() are derived again only when a node's error or card capacities change;
    after every one of 600 random steps (new nodes, bookings, removed cards, mismatch errors, removed nodes,
    a resync that drops a node) they equal a scan of every card."""
    import random

    rng = random.Random(7)
    ledger = _Ledger()
    mirror = Mirror(cast(Ledger, ledger))
    versions: dict[str, int] = {}
    errors = ["", "", "", "S5000 capacity 160 is no configured card model; memoryPerCard [96]",
              "label mthreads.com/sgpu.cores=8 disagrees", "quarantined: unaccounted pods hold cards"]
    derived = 0
    for step in range(600):
        node = f"n{rng.randint(0, 5)}"
        kind = rng.choice(["node", "reserve", "reserve", "reserve", "removed", "resync"])
        if kind == "resync":  # a periodic re-read replaces the whole map; here the ledger lost the node
            ledger.snaps = {n: s for n, s in mirror.nodes.items() if n != node}
            await mirror.resync()
            versions.pop(node, None)
        elif kind == "removed":
            mirror.apply({"node": node, "version": versions.pop(node, 0) + 1, "kind": "removed"})
        else:
            v = versions.get(node, 0) + 1
            if v == 1:
                kind = "node"
            cap = rng.choice([96, 160])
            cards = {str(i): dict(card(rng.choice([0, 8])), capacity=cap, health=rng.choice(["ok", "ok", "removed"]))
                     for i in range(2)} if kind == "node" or rng.random() < 0.3 else {}
            msg = {"node": node, "version": v, "kind": kind, "full": bool(cards), "cards": cards,
                   "error": rng.choice(errors) if kind == "node" else mirror.nodes[node].error}
            if v == 1:  # a node the mirror lacks is read, not built from its message
                assert mirror.apply(msg) == node, step
                mirror.put(new_node(node, cards, str(msg["error"])))
            else:
                assert mirror.apply(msg) is None, step
            versions[node] = v
        before = mirror._derived
        caps, mismatched = _scan(mirror)
        assert mirror.capacities() == caps and dict(mirror.mismatched()) == mismatched, step
        derived += mirror._derived is not before
    assert 0 < derived < 600  # bookings alone did not derive the views again


# -- red team (tests/redis/test_redteam_heads.py): a message applies only onto the write it follows ------------

def _chain_mirror() -> Mirror:
    m = Mirror(Ledger(Redis()))
    m.nodes["n"] = NodeSnapshot("n", 2, stamp="100.000002")
    return m


def test_red_team_a_message_after_another_write_than_ours_is_re_read() -> None:
    m = _chain_mirror()
    msg = {"node": "n", "version": 3, "stamp": "100.000009", "prev": "99.000001", "kind": "bound", "full": False,
           "cards": {}}
    assert m.apply(msg) == "n" and m.nodes["n"].version == 2


def test_red_team_another_write_with_our_version_is_re_read() -> None:
    m = _chain_mirror()
    msg = {"node": "n", "version": 2, "stamp": "100.000005", "prev": "", "kind": "node", "full": True, "cards": {}}
    assert m.apply(msg) == "n"
    same = {**msg, "stamp": "100.000002"}
    assert m.apply(same) is None  # our own write again (the extender applied it first)


def test_red_team_a_message_after_our_write_or_without_prev_applies() -> None:
    m = _chain_mirror()
    msg = {"node": "n", "version": 3, "stamp": "100.000009", "prev": "100.000002", "kind": "bound", "full": False,
           "cards": {}}
    assert m.apply(msg) is None and m.nodes["n"].stamp == "100.000009"
    old = {"node": "n", "version": 4, "kind": "bound", "full": False, "cards": {}}  # a publisher without stamps
    assert m.apply(old) is None and m.nodes["n"].version == 4 and m.nodes["n"].stamp == ""
