"""Red team (an attempt-order inversion): two bind attempts of one pod on one node, A before B (kube-scheduler's retry
after A's call timed out, or a new leader on another replica). A's reserve command ran after B's: its reply was lost
and the ledger sent it again, or it was delivered late. Numbered as it ran, A held the higher number, so A's give-back
(its Binding refused, or its deadline passed) freed the booking while B's Binding, started later, was still in
flight: committed on cards the ledger offered to the next pod.

Now each attempt names itself (reserve's `attempt`, the same on every send of one call) and the booking lists the
attempts holding it (`attempts`): a give-back takes its own name off and frees the booking only when none is left, in
whatever order the commands ran; the same attempt's command run again gets no new number. A give-back never frees a
booking whose Binding is committed (bound). A rewrite (replace_node, observe) carries the list.

Real parts: redis-server, the Ledger, the scripts; replies are lost after the command ran, or a command is held back."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from redis import exceptions as rexc

from shared.domain.annotations import PodUsage
from shared.serving.metrics import RELEASES
from shared.store.keys import Known
from shared.store.ledger import ATTEMPTS_MAX, TOO_MANY_ATTEMPTS, Ledger
from tests.redis.helpers import S4000, around_script, inventory, violations

pytestmark = pytest.mark.redis
WHOLE = (96, 16, 1)  # mem, cores, slices: the whole card
HOLD = 5000


async def assert_held_by_p(ledger: Ledger) -> None:
    snap = (await ledger.snapshots(["a"]))["a"]
    assert set(snap.reservations) == {"p"} and not violations(snap)
    other, _ = await ledger.reserve("a", "q", [0], *WHOLE, pod="ns/q", hold_ms=HOLD)
    assert not other.ok  # the card is p's while an attempt's Binding may come: no second pod on it


@pytest.mark.parametrize("order", ["resent-after", "delivered-after"])
async def test_an_earlier_attempt_whose_reserve_ran_last_does_not_free_the_later_attempt_s_booking(
        ledger: Ledger, order: str) -> None:
    await ledger.upsert_node(inventory("a", S4000, n=1))
    replica = Ledger(ledger.redis)  # attempt B's extender
    later: list[Any] = []

    async def b_reserves() -> None:
        out, _ = await replica.reserve("a", "p", [0], *WHOLE, pod="ns/p", hold_ms=HOLD)
        assert out.ok
        later.append(out)

    if order == "resent-after":  # A's reserve ran, B's ran, A's ran again (its reply was lost)
        runs = around_script(ledger, "reserve", after=b_reserves)
    else:  # A's reserve was held back until B's had run
        runs = around_script(ledger, "reserve", before=b_reserves)
    a, _ = await ledger.reserve("a", "p", [0], *WHOLE, pod="ns/p", hold_ms=HOLD)
    assert a.ok and later and len(runs) == (2 if order == "resent-after" else 1)
    b = later[0]
    assert a.existing and b.existing == (order == "resent-after")  # (A's resend finds the booking its first run made)
    # A's Binding is refused (or its deadline passed): its give-back leaves the booking to B
    assert (await ledger.give_back("a", "p", a.bind_no, attempt=a.attempt))[0] == "kept"
    await assert_held_by_p(ledger)
    # sent again (its reply lost): still kept
    assert (await ledger.give_back("a", "p", a.bind_no, attempt=a.attempt))[0] == "kept"
    await assert_held_by_p(ledger)
    # B's own give-back frees it
    assert (await replica.give_back("a", "p", b.bind_no, attempt=b.attempt))[0] == "released"
    assert (await ledger.snapshots(["a"]))["a"].reservations == {}


async def test_the_same_attempt_s_reserve_run_again_gets_no_new_number(ledger: Ledger) -> None:
    await ledger.upsert_node(inventory("a", S4000, n=1))
    runs = around_script(ledger, "reserve", after=lambda: _noop())
    a, _ = await ledger.reserve("a", "p", [0], *WHOLE, pod="ns/p", hold_ms=HOLD)
    assert a.ok and len(runs) == 2
    first = orjson.loads(runs[0])
    assert a.bind_no == first["bind_no"]  # not renumbered by its own second run
    held = await ledger.redis.hget(ledger.keys.res("a", "p"), "attempts")  # type: ignore[misc]
    assert held == f"{a.attempt}:{a.bind_no}"  # listed once, with its number
    assert (await ledger.give_back("a", "p", a.bind_no, attempt=a.attempt))[0] == "released"


async def _noop() -> None:
    return None


async def test_a_give_back_never_frees_a_booking_whose_binding_is_committed(ledger: Ledger) -> None:
    await ledger.upsert_node(inventory("a", S4000, n=1))
    a, _ = await ledger.reserve("a", "p", [0], *WHOLE, pod="ns/p", hold_ms=HOLD)
    assert a.ok and await ledger.mark_bound("a", "p")  # a Binding of the pod is committed on these cards
    assert (await ledger.give_back("a", "p", a.bind_no, attempt=a.attempt))[0] == "kept"
    assert (await ledger.give_back("a", "p", a.bind_no))[0] == "kept"  # a binder naming no attempt (older release)
    await assert_held_by_p(ledger)
    assert await ledger.release("a", "p")  # the watchers', when the pod goes: unconditional


@pytest.mark.parametrize("rewrite", ["replace_node-pending", "replace_node-in-truth", "observe"])
async def test_a_rewrite_carries_the_attempts_holding_a_booking(ledger: Ledger, rewrite: str) -> None:
    await ledger.upsert_node(inventory("a", S4000, n=2))
    a, _ = await ledger.reserve("a", "p", [0], *WHOLE, pod="ns/p", hold_ms=HOLD)
    b, _ = await ledger.reserve("a", "p", [0], *WHOLE, pod="ns/p", hold_ms=HOLD)
    assert a.ok and b.ok and b.existing and a.attempt != b.attempt
    usage = PodUsage("a", (0,), *WHOLE)
    if rewrite == "replace_node-pending":  # the pod not in the truth yet: kept as a bind in flight
        await ledger.replace_node(inventory("a", S4000, n=2), {}, keep_ms=60_000)
    elif rewrite == "replace_node-in-truth":
        await ledger.replace_node(inventory("a", S4000, n=2), {"p": (usage, "ns/p")}, keep_ms=60_000)
    else:  # the record on other cards than booked: booked anew there
        usage = PodUsage("a", (1,), *WHOLE)
        await ledger.observe("p", usage, pod="ns/p")
    held = await ledger.redis.hget(ledger.keys.res("a", "p"), "attempts")  # type: ignore[misc]
    assert held == f"{a.attempt}:{a.bind_no},{b.attempt}:{b.bind_no}"
    assert (await ledger.give_back("a", "p", a.bind_no, attempt=a.attempt))[0] == "kept"
    snap = (await ledger.snapshots(["a"]))["a"]
    assert set(snap.reservations) == {"p"} and not violations(snap)
    fate = (await ledger.give_back("a", "p", b.bind_no, attempt=b.attempt))[0]
    # pending: the last attempt's give-back frees it; bound (the record was seen): only the watchers free it
    assert fate == ("released" if rewrite == "replace_node-pending" else "kept")


async def test_attempts_holding_one_booking_are_bounded(ledger: Ledger) -> None:
    await ledger.upsert_node(inventory("a", S4000, n=1))
    held = []
    for _ in range(ATTEMPTS_MAX):
        out, _ = await ledger.reserve("a", "p", [0], *WHOLE, pod="ns/p", hold_ms=HOLD)
        assert out.ok
        held.append(out)
    more, _ = await ledger.reserve("a", "p", [0], *WHOLE, pod="ns/p", hold_ms=HOLD)
    assert not more.ok and more.refused.startswith(TOO_MANY_ATTEMPTS), more
    assert (await ledger.give_back("a", "p", held[0].bind_no, attempt=held[0].attempt))[0] == "kept"
    again, _ = await ledger.reserve("a", "p", [0], *WHOLE, pod="ns/p", hold_ms=HOLD)
    assert again.ok and again.existing
    for out in [*held[1:], again]:
        fate = (await ledger.give_back("a", "p", out.bind_no, attempt=out.attempt))[0]
        assert fate == ("released" if out is again else "kept")


@pytest.mark.parametrize("script,body", [
    ("reserve", {"uid": "p", "cards": [0], "mem": 96, "cores": 16, "slices": 1, "hold_ms": HOLD, "attempt": "xyz"}),
    ("reserve", {"uid": "p", "cards": [0], "mem": 96, "cores": 16, "slices": 1, "attempt": "0123456789abcdef"}),
    ("release", {"uid": "p", "if_attempt": 7}),
    ("release", {"uid": "p", "if_attempt": "0123456789abcdef0"}),
])
async def test_a_malformed_attempt_is_refused_as_bad_input(ledger: Ledger, script: str, body: dict[str, Any]) -> None:
    await ledger.upsert_node(inventory("a", S4000, n=1))
    known = Known(frozenset({"0"}))
    keys = ledger.keys.reserve("a", "p", [0], known) if script == "reserve" else ledger.keys.release("a", "p", known)
    with pytest.raises(rexc.ResponseError, match=r"BADINPUT .*attempt"):
        await ledger._scripts[script](keys, [ledger.keys.feed, "a", orjson.dumps(body).decode()])


@pytest.mark.parametrize("joined", [False, True], ids=["alone", "another-attempt-joined"])
async def test_a_reserve_whose_answer_never_came_withdraws_its_attempt(ledger: Ledger, joined: bool) -> None:
    """The reserve ran, every reply was lost until the resends ran out: the caller never learns the attempt's name and
    sends no Binding. Its name comes off the booking at once (Ledger._withdraw), so the booking is free, or left to
    the attempt that joined it, rather than held from every later give-back until the janitor's expiry."""
    await ledger.upsert_node(inventory("a", S4000, n=1))
    ledger.retry_seconds = 0.1
    replica = Ledger(ledger.redis)  # the other attempt's extender
    real = ledger._scripts["reserve"]
    later: list[Any] = []

    async def run(keys: Any = None, args: Any = None, client: Any = None) -> Any:
        await real(keys, args)
        if joined and not later:
            out, _ = await replica.reserve("a", "p", [0], *WHOLE, pod="ns/p", hold_ms=HOLD)
            later.append(out)
        raise rexc.ConnectionError("Connection closed by server.")

    ledger._scripts["reserve"] = run  # type: ignore[assignment]
    counted = RELEASES.labels("reserve_unanswered")._value.get()
    with pytest.raises(rexc.ConnectionError):
        await ledger.reserve("a", "p", [0], *WHOLE, pod="ns/p", hold_ms=HOLD)
    ledger._scripts["reserve"] = real
    if not joined:
        assert (await ledger.snapshots(["a"]))["a"].reservations == {}  # nothing holds the card
        assert RELEASES.labels("reserve_unanswered")._value.get() == counted + 1
        return
    assert RELEASES.labels("reserve_unanswered")._value.get() == counted  # kept for the other attempt
    await assert_held_by_p(ledger)  # the joined attempt's Binding may come
    b = later[0]
    assert (await replica.give_back("a", "p", b.bind_no, attempt=b.attempt))[0] == "released"


async def test_a_give_back_naming_only_an_attempt_leaves_a_booking_that_lists_none(ledger: Ledger) -> None:
    await ledger.upsert_node(inventory("a", S4000, n=1))
    out, _ = await ledger.reserve("a", "p", [0], *WHOLE, pod="ns/p")  # no hold: no list, no number
    assert out.ok
    assert (await ledger.give_back("a", "p", attempt="0123456789abcdef"))[0] == "kept"
    await assert_held_by_p(ledger)
