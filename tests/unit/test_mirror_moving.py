"""Mirror.moving: a node that cannot be read while its Redis Cluster slot moves between shards is left out of a
resync or a re-read alone (its last snapshot kept, the mirror still ready), read again until it can be, and any
other failure is still Redis lost. The ledger here is a stand-in that fails on chosen nodes as redis-py does."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection
from typing import cast

import pytest
from redis import exceptions as rexc
from redis.asyncio import Redis

from shared.domain.state import NodeSnapshot
from shared.serving.metrics import MIRROR_MOVING
from shared.store import mirror as mirror_module
from shared.store.ledger import Ledger, Reread, UnknownRedirect, slot_moving
from shared.store.mirror import Mirror


class _Ledger:
    def __init__(self, snaps: dict[str, NodeSnapshot]) -> None:
        self.snaps = snaps
        self.moving: set[str] = set()  # nodes whose reads fail for a moving slot
        self.down = False  # every read fails as Redis unreachable
        self.on_moving: list[Callable[[str], None]] = []  # (Mirror registers itself)
        self.reads: list[list[str]] = []  # the nodes of each reread
        self.apart: list[set[str]] = []  # and the ones it was asked to read alone
        self.redis = Redis(port=1)  # never connected here

    def forget(self, node: str, uid: str | None = None) -> None:  # (Ledger's hints of a node's keys: none here)
        pass

    def known_nodes(self) -> set[str]:
        return set()

    async def nodes(self) -> list[str]:
        return sorted(self.snaps)

    async def heads(self, names: list[str], isolate: bool = False) -> dict[str, tuple[int, str]]:
        return {n: (s.version, s.stamp) for n, s in self.snaps.items() if n in names and n not in self.moving}

    async def reread(self, names: list[str], previous: dict[str, int],
                  isolate: bool = False, apart: Collection[str] = ()) -> Reread:
        self.reads.append(list(names))
        self.apart.append(set(apart))
        if self.down:
            raise rexc.ConnectionError("Redis is down")
        if not isolate and self.moving & set(names):
            raise rexc.ClusterError("TTL exhausted.")
        return Reread({n: self.snaps[n] for n in names if n not in self.moving}, set(), {},
                      moving=self.moving & set(names))

    async def slot_open(self, node: str) -> bool:
        return node in self.moving

    async def snapshot(self, node: str, give_up: object = None) -> NodeSnapshot | None:
        if self.down:
            raise rexc.ConnectionError("Redis is down")
        if node in self.moving:  # as Ledger._call: its listeners told, then raised
            for listener in self.on_moving:
                listener(node)
            raise UnknownRedirect("a redirect to a Redis node the cluster client does not know yet")
        return self.snaps.get(node)


def snap(node: str, version: int) -> NodeSnapshot:
    return NodeSnapshot(node, version, stamp=f"s{version}")


@pytest.mark.parametrize(("error", "moving"), [
    (rexc.ClusterError("TTL exhausted."), True),
    (rexc.TryAgainError("TRYAGAIN"), True),
    (UnknownRedirect("ask"), True),
    (rexc.ClusterDownError("CLUSTERDOWN The cluster is down"), False),  # a subclass: the cluster, not a slot
    (rexc.ConnectionError("refused"), False),
    (rexc.SlotNotCoveredError("no node"), False),
])
def test_only_a_moving_slot_is_read_around(error: BaseException, moving: bool) -> None:
    assert slot_moving(error) is moving


async def test_a_resync_reads_around_a_moving_node_and_reads_it_again_until_it_can() -> None:
    ledger = _Ledger({"a": snap("a", 1), "b": snap("b", 1), "c": snap("c", 1)})
    mirror = Mirror(cast(Ledger, ledger))
    await mirror.resync(full=True)
    old_b = mirror.nodes["b"]
    ledger.moving = {"b"}
    ledger.snaps = {n: snap(n, 2) for n in ledger.snaps}  # written everywhere (b before its move began)
    await mirror.resync(full=True)
    assert mirror.moving == {"b"} and MIRROR_MOVING._value.get() == 1
    assert mirror.nodes["b"] is old_b  # kept as last read
    assert mirror.nodes["a"].version == 2 and mirror.nodes["c"].version == 2  # the others current
    resyncs = mirror.resyncs
    await mirror.resync(only=mirror.moving)  # the loop's read of the moving nodes alone
    assert mirror.moving == {"b"} and ledger.reads[-1] == ["b"] and ledger.apart[-1] == {"b"}
    assert mirror.resyncs == resyncs  # not a periodic resync: the full reads' count (FULL_EVERY) does not move
    await mirror.resync()  # periodic: a moving node is read again even when its head looks unchanged
    assert mirror.moving == {"b"} and "b" in ledger.reads[-1]
    ledger.moving = set()  # the move ended
    await mirror.resync(only=mirror.moving)
    assert not mirror.moving and MIRROR_MOVING._value.get() == 0
    assert mirror.nodes["b"].version == 2


async def test_the_moving_nodes_are_read_again_later_and_later_while_they_stay_moving() -> None:
    ledger = _Ledger({"a": snap("a", 1), "b": snap("b", 1)})
    mirror = Mirror(cast(Ledger, ledger))
    loop = asyncio.get_running_loop()
    ledger.moving = {"b"}
    await mirror.resync(full=True)
    waits = [mirror._moving_at - loop.time()]
    for _ in range(5):
        await mirror.resync(only=mirror.moving)
        waits.append(mirror._moving_at - loop.time())
    expected = [1, 2, 4, 8, 8, 8]
    assert [round(w) for w in waits] == [e * mirror_module.MOVING_RETRY_SECONDS for e in expected], waits
    ledger.snaps["c"] = snap("c", 1)
    ledger.moving = {"b", "c"}  # another node starts moving: read again soon
    await mirror.resync()
    assert mirror.moving == {"b", "c"} and round(mirror._moving_at - loop.time()) == 1
    ledger.moving = set()
    await mirror.resync(only=mirror.moving)
    assert not mirror.moving and mirror._moving_wait == mirror_module.MOVING_RETRY_SECONDS


async def test_a_moving_node_gone_from_the_ledger_is_no_longer_moving() -> None:
    ledger = _Ledger({"a": snap("a", 1), "b": snap("b", 1)})
    mirror = Mirror(cast(Ledger, ledger))
    ledger.moving = {"b"}
    await mirror.resync(full=True)
    assert mirror.moving == {"b"} and "b" not in mirror.nodes  # never read: nothing to keep, and not offered
    del ledger.snaps["b"]
    await mirror.resync(only=mirror.moving)
    assert mirror.moving == {"b"}  # unlisted, but its slot still open (asked alone): held back until it closes
    ledger.moving = set()
    await mirror.resync(only=mirror.moving)
    assert not mirror.moving
    mirror.note_moving("plain")  # a failed release on a node without cards, which the ledger never listed
    await mirror.resync(only=mirror.moving)
    assert not mirror.moving  # its slot is closed


async def test_a_script_failing_for_the_move_marks_its_node_through_the_ledger() -> None:
    """A node whose version reads fine mid-move (one key) is learnt moving from any script of the role that failed
    there (Ledger._call tells Ledger.on_moving): a bind's reserve, the janitor's expire, a re-read alone."""
    real = Ledger(Redis(port=1))  # never connected: only its listeners are used
    mirror = Mirror(real)
    assert mirror.note_moving in real.on_moving
    real._moving("n1")
    assert mirror.moving == {"n1"}


async def test_a_re_read_alone_that_fails_for_the_move_marks_the_node_and_any_other_failure_is_raised() -> None:
    ledger = _Ledger({"a": snap("a", 1), "b": snap("b", 1)})
    mirror = Mirror(cast(Ledger, ledger))
    await mirror.resync(full=True)
    ledger.moving = {"b"}
    gap = b'{"node": "b", "version": 3, "kind": "release", "full": false, "cards": {}, "uid": "u", "res": false}'
    await mirror._consume(gap)  # a gap: b must be re-read, and cannot be
    assert mirror.moving == {"b"} and mirror.nodes["b"].version == 1
    assert mirror._moving_at <= asyncio.get_running_loop().time() + mirror_module.MOVING_RETRY_SECONDS
    ledger.moving = set()
    ledger.snaps["b"] = snap("b", 3)
    mirror._moving_at = asyncio.get_running_loop().time() + 30
    await mirror._consume(gap)  # a message for a moving node: read soon, with the moving nodes (not alone here)
    assert mirror.moving == {"b"} and mirror._moving_at == 0.0
    await mirror.resync(only=mirror.moving)
    assert not mirror.moving and mirror.nodes["b"].version == 3
    ledger.down = True
    with pytest.raises(rexc.ConnectionError):  # Redis lost: the mirror's loop goes unready and re-reads all
        await mirror._consume(gap.replace(b'"version": 3', b'"version": 5'))
    with pytest.raises(rexc.ConnectionError):
        await mirror.resync(full=True)
