"""Audit, the load benchmark's ledger-side correctness counters on a real redis-server: over-committed cards in the
ledger's hashes, ledger/annotation mismatches, leaked reservations. Each is computed by the function the benchmark
calls (`check`, `leaked_reservations`, through `LedgerView` as `bench.load` builds it), fed its fault, and reads 0
on the clean ledger. Found by this audit: the comparison of the ledger with the annotations went over the ledger's
cards only, so a pod's record on a node (or a card) the ledger did not hold, as with a wrong --key-prefix or a
ledger that lost the node, was compared with nothing: 0 mismatches, 0 over-committed, 0 leaks, all from an empty
ledger. A Redis that cannot be read is an error, never 0.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.exceptions import RedisError

from bench.load.checks import check, leaked_reservations
from bench.load.cluster import LedgerView
from deploy.local.redis import RedisServer
from shared.store.ledger import Ledger
from tests.redis.helpers import S4000, inventory
from tests.unit.test_audit_bench_counters import FakeKube, pod

pytestmark = pytest.mark.redis
NODE = "bench-node-00000"  # an S4000 node as the benchmark names it (node_model: 96 units)
OTHER = "bench-node-00002"  # another S4000 node
NODES = [NODE, OTHER]


@pytest.fixture
async def view(ledger: Ledger, redis_server: RedisServer) -> AsyncIterator[LedgerView]:
    """Both nodes in the ledger (8 cards each); u1 bound on NODE's card 0 (8 units, 2 cores, 1 slice), as the
    extender books pod "a" of `CLEAN`."""
    for n in NODES:
        await ledger.upsert_node(inventory(n, S4000, 8))
    assert (await ledger.reserve(NODE, "u1", [0], 8, 2, 1, pod="ns/a"))[0].ok
    assert await ledger.mark_bound(NODE, "u1")
    v = LedgerView(redis_server.url, "mt")
    yield v
    await v.close()


CLEAN = [pod("a", NODE, units=8, cores=2)]


async def ledger_counters(v: LedgerView, pods: list[dict[str, Any]], bound: int = 1) -> tuple[int, int, bool]:
    out = await check(FakeKube(pods), "ns", v, NODES, bound)
    return out["overcommitted_cards_ledger"], out["ledger_annotation_mismatches"], out["ledger_settled"]


async def test_a_clean_ledger_counts_nothing(view: LedgerView) -> None:
    assert await ledger_counters(view, CLEAN) == (0, 0, True)


@pytest.mark.parametrize(("field", "value"), [("mem_used", 97), ("cores_used", 17), ("slices", 17),
                                              ("mem_free", -1), ("cores_free", -1)])
async def test_a_card_over_committed_in_the_ledger_is_counted(view: LedgerView, ledger: Ledger, field: str,
                                                              value: int) -> None:
    await ledger.redis.hset(ledger.keys.card(NODE, 3), field, str(value))  # type: ignore[misc]
    over, mismatch, _ = await ledger_counters(view, CLEAN)
    assert over == 1
    assert mismatch == (1 if field in ("mem_used", "cores_used", "slices") else 0)  # the annotations book nothing


async def test_a_booking_the_annotations_do_not_hold_is_a_mismatch(view: LedgerView) -> None:
    assert await ledger_counters(view, []) == (0, 1, True)  # pod "a" gone from the API, its booking kept


async def test_annotations_that_differ_from_the_booking_are_a_mismatch(view: LedgerView) -> None:
    assert (await ledger_counters(view, [pod("a", NODE, units=10, cores=2)]))[1] == 1


async def test_a_record_on_a_node_the_ledger_lacks_is_a_mismatch(view: LedgerView) -> None:
    """The ledger holds nothing of "bench-node-00004" (a wrong --key-prefix holds nothing of any node)."""
    assert (await ledger_counters(view, [*CLEAN, pod("x", "bench-node-00004", units=8)]))[1] == 1


async def test_a_record_on_a_card_the_ledger_lacks_is_a_mismatch(view: LedgerView) -> None:
    assert (await ledger_counters(view, [*CLEAN, pod("x", OTHER, cards=(9,), units=8)]))[1] == 1


async def test_an_empty_ledger_is_not_a_clean_one(redis_server: RedisServer, redis_client: Any) -> None:
    """A --key-prefix the roles do not use: nothing read, every annotated card a mismatch."""
    v = LedgerView(redis_server.url, "wrong")
    try:
        over, mismatch, settled = await ledger_counters(v, CLEAN, bound=0)
    finally:
        await v.close()
    assert (over, mismatch, settled) == (0, 1, True)


async def test_a_reservation_left_for_a_deleted_pod_is_a_leak(view: LedgerView, ledger: Ledger) -> None:
    assert (await ledger.reserve(OTHER, "u2", [1], 4, 1, 1, pod="ns/gone"))[0].ok  # pending, pod deleted
    assert sorted(await leaked_reservations(view, NODES, 0)) == ["u1", "u2"]
    assert await ledger.release(NODE, "u1") and await ledger.release(OTHER, "u2")
    assert await leaked_reservations(view, NODES, 0) == []


async def test_a_redis_that_cannot_be_read_is_an_error_not_zero() -> None:
    v = LedgerView("redis://127.0.0.1:1/0", "mt")  # nothing listens there
    try:
        with pytest.raises(RedisError):  # after the ledger's own resends (retry_seconds): never a count
            await ledger_counters(v, CLEAN)
        with pytest.raises(RedisError):
            await leaked_reservations(v, NODES, 0)
    finally:
        await v.close()


async def test_a_booking_never_confirmed_fails_the_run(ledger: Ledger, redis_server: RedisServer,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A pod bound with its record while its booking stays pending (the confirmation lost: the ledger's TTL may then
    free the card under a running pod) matches the annotations card for card: 0 over-committed, 0 mismatches. Only
    `ledger_settled` said so, and neither the summary, the table nor the exit code read it."""
    from bench.load import checks
    from bench.load.cli import failed
    from bench.load.phase import Phase
    from bench.load.report import summarize, table

    monkeypatch.setattr(checks, "SETTLE_SECONDS", 1.0)
    await ledger.upsert_node(inventory(NODE, S4000, 8))
    assert (await ledger.reserve(NODE, "u1", [0], 8, 2, 1, pod="ns/a"))[0].ok  # never marked bound
    v = LedgerView(redis_server.url, "mt")
    try:
        out = await check(FakeKube(CLEAN), "ns", v, [NODE], 1)
    finally:
        await v.close()
    assert (out["overcommitted_cards_ledger"], out["ledger_annotation_mismatches"], out["ledger_settled"]) \
        == (0, 0, False)
    rows = []
    for settled in (True, False):
        ph = Phase("ours", 1, 1, 0)
        ph.result = {"throughput_pods_s": 10.0, "pods": 1, "bound": 1, "timed_out": False, "leaked_reservations": 0,
                     "correctness": {**out, "ledger_settled": settled}}
        pl = Phase("plain", 1, 1, 0)
        pl.result = {"throughput_pods_s": 10.0, "pods": 1, "bound": 1, "timed_out": False}
        rows.append(summarize([ph, pl], fine=False))
    assert rows[0][0]["ledger_unsettled_phases"] == 0 and not failed(rows[0])
    assert rows[1][0]["ledger_unsettled_phases"] == 1 and failed(rows[1])
    assert "1 unsettled" in table(rows[1], [])
