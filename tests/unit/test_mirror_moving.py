"""Mirror.moving: a node that cannot be read while its Redis Cluster slot moves between shards is left out of a
resync or a re-read alone (its last snapshot kept, the mirror still ready), read again until it can be, and any
other failure is still Redis lost. The ledger here is a stand-in that fails on chosen nodes as redis-py does."""

from __future__ import annotations

import asyncio
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
        self.redis = Redis(port=1)  # never connected here

    async def nodes(self) -> list[str]:
        return sorted(self.snaps)

    async def heads(self, names: list[str], isolate: bool = False) -> dict[str, tuple[int, str]]:
        return {n: (s.version, s.stamp) for n, s in self.snaps.items() if n in names and n not in self.moving}

    async def reread(self, names: list[str], previous: dict[str, int], isolate: bool = False) -> Reread:
        if self.down:
            raise rexc.ConnectionError("Redis is down")
        if not isolate and self.moving & set(names):
            raise rexc.ClusterError("TTL exhausted.")
        return Reread({n: self.snaps[n] for n in names if n not in self.moving}, set(), {},
                      moving=self.moving & set(names))

    async def snapshot(self, node: str) -> NodeSnapshot | None:
        if self.down:
            raise rexc.ConnectionError("Redis is down")
        if node in self.moving:
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
    assert mirror._resync_delay() == mirror_module.MOVING_RETRY_SECONDS < mirror.resync_seconds
    await mirror.resync()  # periodic: a moving node is read again even when its head looks unchanged
    assert mirror.moving == {"b"}
    ledger.moving = set()  # the move ended
    await mirror.resync()
    assert not mirror.moving and MIRROR_MOVING._value.get() == 0
    assert mirror.nodes["b"].version == 2
    assert mirror._resync_delay() == mirror.resync_seconds


async def test_a_moving_node_gone_from_the_ledger_is_no_longer_moving() -> None:
    ledger = _Ledger({"a": snap("a", 1), "b": snap("b", 1)})
    mirror = Mirror(cast(Ledger, ledger))
    ledger.moving = {"b"}
    await mirror.resync(full=True)
    assert mirror.moving == {"b"} and "b" not in mirror.nodes  # never read: nothing to keep, and not offered
    del ledger.snaps["b"]
    ledger.moving = set()
    await mirror.resync(full=True)
    assert not mirror.moving


async def test_a_re_read_alone_that_fails_for_the_move_marks_the_node_and_any_other_failure_is_raised() -> None:
    ledger = _Ledger({"a": snap("a", 1), "b": snap("b", 1)})
    mirror = Mirror(cast(Ledger, ledger))
    await mirror.resync(full=True)
    mirror._next_resync = asyncio.get_running_loop().time() + 30
    ledger.moving = {"b"}
    gap = b'{"node": "b", "version": 3, "kind": "release", "full": false, "cards": {}, "uid": "u", "res": false}'
    await mirror._consume(gap)  # a gap: b must be re-read, and cannot be
    assert mirror.moving == {"b"} and mirror.nodes["b"].version == 1
    assert mirror._next_resync <= asyncio.get_running_loop().time() + mirror_module.MOVING_RETRY_SECONDS
    ledger.moving = set()
    ledger.snaps["b"] = snap("b", 3)
    await mirror._consume(gap)  # read alone now: no longer moving
    assert not mirror.moving and mirror.nodes["b"].version == 3
    ledger.down = True
    with pytest.raises(rexc.ConnectionError):  # Redis lost: the mirror's loop goes unready and re-reads all
        await mirror._consume(gap.replace(b'"version": 3', b'"version": 5'))
    with pytest.raises(rexc.ConnectionError):
        await mirror.resync(full=True)
