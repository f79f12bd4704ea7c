"""Red team (a give-back sent again): a binder whose Binding failed gives its booking back with the number its reserve
answered (`release`'s `if_bind_no`), so that a later attempt of the pod keeps the booking it holds. The release ran,
its reply was lost (a timeout, a cut connection), and the ledger sent it again (every script is idempotent by uid).
Between the two runs a later attempt of the pod (kube-scheduler's retry after the first bind's call timed out, or a
new leader on another replica) found nothing booked and booked anew: its `binds` counted from 1 again, the number
the first attempt names, so the second run of the give-back released it. That attempt's Binding was then committed
on cards the ledger offered to the next pod: two pods on one whole card.

Now bind attempts are numbered by the node (`bind_seq`, rising across its bookings), so a booking made after an
attempt's number was given out always carries a higher one, and the stale give-back leaves it.

Real parts: redis-server, the Ledger, the scripts; the release's reply is lost after it ran."""

from __future__ import annotations

from typing import Any

import pytest
from redis import exceptions as rexc

from shared.store.ledger import Ledger
from tests.redis.helpers import S4000, inventory, violations

pytestmark = pytest.mark.redis
WHOLE = (96, 16, 1)  # mem, cores, slices: the whole card
HOLD = 5000


async def test_a_give_back_sent_again_leaves_the_booking_a_later_attempt_made_meanwhile(ledger: Ledger) -> None:
    await ledger.upsert_node(inventory("a", S4000, n=1))
    first, _ = await ledger.reserve("a", "p", [0], *WHOLE, pod="ns/p", hold_ms=HOLD)
    assert first.ok and not first.existing
    replica = Ledger(ledger.redis)  # the later attempt's extender
    later: list[Any] = []
    real = ledger._scripts["release"]

    async def run(keys: Any = None, args: Any = None, client: Any = None) -> Any:
        out = await real(keys, args)
        if not later:  # the first run released it; before its reply comes, the later attempt books anew
            booked, _ = await replica.reserve("a", "p", [0], *WHOLE, pod="ns/p", hold_ms=HOLD)
            later.append(booked)
            raise rexc.TimeoutError("Timeout reading from socket")
        return out

    ledger._scripts["release"] = run  # type: ignore[assignment]
    fate, _ = await ledger.give_back("a", "p", first.bind_no)
    assert later and later[0].ok and not later[0].existing  # booked anew, its Binding in flight
    assert later[0].bind_no > first.bind_no
    assert fate == "kept"  # the second run found the later attempt's booking and left it
    snap = (await ledger.snapshots(["a"]))["a"]
    assert set(snap.reservations) == {"p"} and not violations(snap)
    other, _ = await ledger.reserve("a", "q", [0], *WHOLE, pod="ns/q", hold_ms=HOLD)
    assert not other.ok  # the card is the later attempt's: no second pod on it
    assert (await ledger.give_back("a", "p", later[0].bind_no))[0] == "released"  # its own give-back still frees it


async def test_attempt_numbers_rise_across_bookings_and_above_an_older_booking_s_own(ledger: Ledger) -> None:
    await ledger.upsert_node(inventory("a", S4000, n=2))
    numbers = []
    for _ in range(3):  # booked, given back, booked anew: each attempt gets a higher number
        out, _ = await ledger.reserve("a", "p", [0], *WHOLE, pod="ns/p", hold_ms=HOLD)
        assert out.ok
        numbers.append(out.bind_no)
        assert (await ledger.give_back("a", "p", out.bind_no))[0] == "released"
    assert numbers == sorted(set(numbers))
    # a booking numbered by its own count (an older release's) above the node's sequence: the next attempt's is above it
    out, _ = await ledger.reserve("a", "r", [1], *WHOLE, pod="ns/r", hold_ms=HOLD)
    assert out.ok
    await ledger.redis.hset(ledger.keys.res("a", "r"), "binds", "50")  # type: ignore[misc]
    again, _ = await ledger.reserve("a", "r", [1], *WHOLE, pod="ns/r", hold_ms=HOLD)
    assert again.ok and again.existing and again.bind_no == 51
    assert (await ledger.give_back("a", "r", 50))[0] == "kept"


@pytest.mark.parametrize("damaged", ["abc", "1e300", "-7", "4503599627370496"])
async def test_a_damaged_sequence_restarts_the_count_and_books_nothing_half(ledger: Ledger, damaged: str) -> None:
    """A hand-edited `bind_seq` (not a number, huge, negative, past release's 2^52 bound) neither fails the booking
    (HINCRBY would, after the card usage was written) nor gives a number release cannot name."""
    await ledger.upsert_node(inventory("a", S4000, n=2))
    await ledger.redis.hset(ledger.keys.node("a"), "bind_seq", damaged)  # type: ignore[misc]
    out, _ = await ledger.reserve("a", "p", [0], *WHOLE, pod="ns/p", hold_ms=HOLD)
    assert out.ok and 1 <= out.bind_no < 2**52
    await ledger.redis.hset(ledger.keys.res("a", "p"), "binds", damaged)  # type: ignore[misc]
    again, _ = await ledger.reserve("a", "p", [0], *WHOLE, pod="ns/p", hold_ms=HOLD)
    assert again.ok and again.existing and 1 <= again.bind_no < 2**52
    snap = (await ledger.snapshots(["a"]))["a"]
    assert set(snap.reservations) == {"p"} and not violations(snap)
    assert (await ledger.give_back("a", "p", again.bind_no))[0] == "released"
