"""Red team (found by tests/redis/test_redteam_resend_stress.py): a rewrite of a node dropped its bookings' attempt
numbers. Two bind attempts of one pod on one node (kube-scheduler's retry on another replica): the first booked
(`bind_no` 1), the second found that booking (`existing`, `bind_no` 2). The first attempt's Binding was refused; it
gave its booking back naming its number (`give_back(if_bind_no=1)`), and the script left the booking to the later
attempt (`binds` 2 above it: kept), but its reply was lost, and the ledger sent it again. Meanwhile the second attempt's
Binding was committed and its booking marked bound, and the reconciler rewrote the node from the API's truth
(`replace_node`: the pod in its truth, or bound since its read and kept by the keep window). The rewrite booked the
reservation anew without its `binds`, so the give-back's second run found no later attempt holding it and released it:
the pod runs on the card, and the ledger offered the card to the next pod.

Now a rewrite keeps a reservation's attempt number (`replace_node` for the pods of its truth and for those it keeps;
`observe` when it books a record over a booking of other cards), so a give-back of an earlier attempt leaves it
however often the booking was written since.

Real parts: redis-server, the Ledger, the scripts; the release's reply is lost after it ran."""

from __future__ import annotations

import pytest

from shared.domain.annotations import PodUsage
from shared.store.ledger import Ledger
from tests.redis.helpers import S4000, around_script, inventory, violations

pytestmark = pytest.mark.redis
WHOLE = (96, 16, 1)  # mem, cores, slices: the whole card
HOLD = 5000


async def two_attempts(ledger: Ledger) -> tuple[int, int]:
    """A pod's two bind attempts on one node's only card: (the first's bind_no, the second's)."""
    await ledger.upsert_node(inventory("a", S4000, n=1))
    first, _ = await ledger.reserve("a", "p", [0], *WHOLE, pod="ns/p", hold_ms=HOLD)
    later, _ = await ledger.reserve("a", "p", [0], *WHOLE, pod="ns/p", hold_ms=HOLD)
    assert first.ok and later.ok and later.existing and later.bind_no > first.bind_no
    return first.bind_no, later.bind_no


@pytest.mark.parametrize("in_truth", [True, False], ids=["rewritten-from-truth", "kept-by-keep-window"])
async def test_a_give_back_sent_again_after_a_rewrite_leaves_the_later_attempt_s_bound_booking(
        ledger: Ledger, in_truth: bool) -> None:
    first, _later = await two_attempts(ledger)
    replica = Ledger(ledger.redis)  # the later attempt's extender, and the reconciler

    async def meanwhile() -> None:
        # the later attempt's Binding is committed and confirmed; the reconciler rewrites the node from its truth
        assert await replica.mark_bound("a", "p")
        truth = {"p": (PodUsage("a", (0,), *WHOLE), "ns/p")} if in_truth else {}
        out = await replica.replace_node(inventory("a", S4000, n=1), truth, keep_ms=60_000, keep_bound=True)
        assert out["dropped"] == 0

    runs = around_script(ledger, "release", after=meanwhile)
    fate, _ = await ledger.give_back("a", "p", first)
    assert len(runs) == 2
    assert fate == "kept"  # both runs: the later attempt holds it
    snap = (await ledger.snapshots(["a"]))["a"]
    assert set(snap.reservations) == {"p"} and snap.reservations["p"].state == "bound" and not violations(snap)
    other, _ = await ledger.reserve("a", "q", [0], *WHOLE, pod="ns/q", hold_ms=HOLD)
    assert not other.ok  # the card is p's: no second pod on it


async def test_an_observe_that_books_another_record_keeps_the_attempt_number(ledger: Ledger) -> None:
    """A record of other cards than the booking (booked over it by the pod watcher) keeps the booking's number: an
    earlier attempt's give-back leaves the pod's booking."""
    await ledger.upsert_node(inventory("a", S4000, n=2))
    first, _ = await ledger.reserve("a", "p", [0], 8, 2, 1, pod="ns/p", hold_ms=HOLD)
    later, _ = await ledger.reserve("a", "p", [0], 8, 2, 1, pod="ns/p", hold_ms=HOLD)
    assert later.existing and later.bind_no > first.bind_no
    out = await ledger.observe("p", PodUsage("a", (1,), 8, 2, 1), "ns/p", keep_bound=True)
    assert out["ok"] and out["changed"]
    assert (await ledger.give_back("a", "p", first.bind_no))[0] == "kept"
    assert (await ledger.snapshots(["a"]))["a"].reservations["p"].cards == (1,)
