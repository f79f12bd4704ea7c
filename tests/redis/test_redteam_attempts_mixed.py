"""Red team (the bind attempts' list beside what names no attempt): a booking's `attempts` (reserve.lua's `attempt`,
release.lua's `if_attempt`) frees it only when no listed attempt is left. Not every holder is listed:

* a binder of the release before (two releases side by side during a roll, docs/install.md "While two releases run
  side by side") runs its own reserve.lua, which numbers its attempt in `binds` and names none. Before the list, a
  give-back naming an earlier number left the booking to it (`binds` above); with the list, the last named attempt's
  give-back found no name left and freed the booking under the older binder's Binding (a regression: the older
  binder's Binding, started after, was committed on cards the ledger offered to the next pod). The same when the
  older binder made the booking and a named attempt joined it: its give-back took off the only name;
* a rewrite by the release before (its replace_node or observe) writes the booking anew with its `binds` and without
  the list; a named attempt's give-back then goes by the number its reserve answered. An attempt whose reserve ran
  again (its reply lost) after a later attempt's was answered that later attempt's number, not its own (the docs say
  "gets its number ... again"), so its give-back freed the booking under the later attempt's Binding;
* a damaged list (empty: a hand edit) held nobody, and the booking was freed whatever `binds` said; an attempt
  joining it then listed itself alone, and its give-back freed the booking under the Bindings of the attempts
  the list had named.

Now each entry keeps its attempt's number (`<name>:<n>`, answered again to its own command run again), the booking
keeps the number of the last named attempt (`named_binds`), and a holder that names none is listed as `*<n>` when a
named attempt joins (its `binds` above every named one's): no named give-back takes it off (the janitor's expiry
frees such a booking, as before); a give-back finding `binds` above the last named attempt's keeps the booking; an
empty list is no list (the numbers decide), and an attempt joining one lists the booking's number as `*<n>`.

Real parts: redis-server, the Ledger, the scripts. The older binder is this reserve.lua called as that release's
binder called it, with `hold_ms` and no `attempt` (its own script differs only by the lines `attempt` selects); the
older rewrite is its result, the booking without the fields it does not know."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from shared.store.ledger import Ledger
from tests.redis.helpers import S4000, around_script, inventory, violations

pytestmark = pytest.mark.redis
WHOLE = (96, 16, 1)  # mem, cores, slices: the whole card
HOLD = 5000


async def older_reserve(ledger: Ledger, node: str = "a", uid: str = "p") -> dict[str, Any]:
    """A bind attempt of the release before: reserve with a hold, naming no attempt."""
    body = {"uid": uid, "cards": [0], "mem": WHOLE[0], "cores": WHOLE[1], "slices": WHOLE[2], "whole": False,
            "model": 0, "pod": f"ns/{uid}", "hold_ms": HOLD}
    out: dict[str, Any] = orjson.loads(await ledger._call(
        "reserve", node, body, lambda k: ledger.keys.reserve(node, uid, [0], k)))
    assert out["ok"], out
    return out


async def older_rewrite(ledger: Ledger, node: str = "a", uid: str = "p") -> None:
    """The booking as a rewrite of the release before leaves it (replace_node, observe): `binds` kept, the fields it
    does not know gone."""
    await ledger.redis.hdel(ledger.keys.res(node, uid), "attempts", "named_binds")  # type: ignore[misc]


async def assert_held_by_p(ledger: Ledger) -> None:
    snap = (await ledger.snapshots(["a"]))["a"]
    assert set(snap.reservations) == {"p"} and not violations(snap)
    other, _ = await ledger.reserve("a", "q", [0], *WHOLE, pod="ns/q", hold_ms=HOLD)
    assert not other.ok  # the card is p's while an attempt's Binding may come: no second pod on it


@pytest.mark.parametrize("rewrite", [None, "replace_node"])
async def test_a_named_give_back_leaves_a_booking_an_older_binder_s_attempt_took_after_it(
        ledger: Ledger, rewrite: str | None) -> None:
    await ledger.upsert_node(inventory("a", S4000, n=2))
    a, _ = await ledger.reserve("a", "p", [0], *WHOLE, pod="ns/p", hold_ms=HOLD)
    old = await older_reserve(ledger)  # kube-scheduler's retry on a replica of the release before
    assert a.ok and old["existing"] and old["bind_no"] > a.bind_no
    if rewrite:  # this release's reconciler writes the node anew: the booking kept as it was (book's carry)
        await ledger.replace_node(inventory("a", S4000, n=2), {}, keep_ms=60_000)
    # A's Binding refused: before the list its number (below the older attempt's) left the booking; still so
    assert (await ledger.give_back("a", "p", a.bind_no, attempt=a.attempt))[0] == "kept"
    await assert_held_by_p(ledger)


async def test_a_named_attempt_joining_an_older_binder_s_booking_does_not_free_it(ledger: Ledger) -> None:
    await ledger.upsert_node(inventory("a", S4000, n=1))
    old = await older_reserve(ledger)  # made by the release before: no list
    b, _ = await ledger.reserve("a", "p", [0], *WHOLE, pod="ns/p", hold_ms=HOLD)
    assert not old["existing"] and b.ok and b.existing
    # B's Binding refused (B started first, its reserve ran late: the older attempt's Binding may come after B's
    # deadline): B's name off, the older attempt still holds it
    assert (await ledger.give_back("a", "p", b.bind_no, attempt=b.attempt))[0] == "kept"
    await assert_held_by_p(ledger)
    # no named give-back frees it (sent again, or another named attempt's); the janitor's expiry does, as before
    c, _ = await ledger.reserve("a", "p", [0], *WHOLE, pod="ns/p", hold_ms=HOLD)
    assert (await ledger.give_back("a", "p", c.bind_no, attempt=c.attempt))[0] == "kept"
    await assert_held_by_p(ledger)


async def test_an_attempt_s_reserve_run_again_is_answered_its_own_number(ledger: Ledger) -> None:
    await ledger.upsert_node(inventory("a", S4000, n=1))
    replica = Ledger(ledger.redis)
    later: list[Any] = []

    async def b_reserves() -> None:
        later.append((await replica.reserve("a", "p", [0], *WHOLE, pod="ns/p", hold_ms=HOLD))[0])

    raw = around_script(ledger, "reserve", after=b_reserves)
    a, _ = await ledger.reserve("a", "p", [0], *WHOLE, pod="ns/p", hold_ms=HOLD)
    runs = [orjson.loads(r) for r in raw]
    b = later[0]
    assert a.ok and b.ok and b.existing and len(runs) == 2 and b.bind_no > runs[0]["bind_no"]
    assert a.bind_no == runs[0]["bind_no"]  # its own, not B's
    # a rewrite by the release before drops the list: A's give-back goes by its number, below B's: kept for B
    await older_rewrite(ledger)
    assert (await ledger.give_back("a", "p", a.bind_no, attempt=a.attempt))[0] == "kept"
    await assert_held_by_p(ledger)
    assert (await replica.give_back("a", "p", b.bind_no, attempt=b.attempt))[0] == "released"


@pytest.mark.parametrize("damaged", ["", ","])
async def test_a_damaged_empty_list_is_no_list(ledger: Ledger, damaged: str) -> None:
    await ledger.upsert_node(inventory("a", S4000, n=1))
    a, _ = await ledger.reserve("a", "p", [0], *WHOLE, pod="ns/p", hold_ms=HOLD)
    b, _ = await ledger.reserve("a", "p", [0], *WHOLE, pod="ns/p", hold_ms=HOLD)
    assert a.ok and b.ok and b.bind_no > a.bind_no
    await ledger.redis.hset(ledger.keys.res("a", "p"), "attempts", damaged)  # type: ignore[misc]
    # no name to go by: the numbers decide, as for a booking without a list (B's is above A's)
    assert (await ledger.give_back("a", "p", a.bind_no, attempt=a.attempt))[0] == "kept"
    await assert_held_by_p(ledger)
    assert (await ledger.give_back("a", "p", b.bind_no, attempt=b.attempt))[0] == "released"


async def test_an_attempt_joining_a_damaged_list_leaves_the_booking_to_the_numbers_on_it(ledger: Ledger) -> None:
    await ledger.upsert_node(inventory("a", S4000, n=1))
    a, _ = await ledger.reserve("a", "p", [0], *WHOLE, pod="ns/p", hold_ms=HOLD)
    b, _ = await ledger.reserve("a", "p", [0], *WHOLE, pod="ns/p", hold_ms=HOLD)
    await ledger.redis.hset(ledger.keys.res("a", "p"), "attempts", "")  # type: ignore[misc]
    c, _ = await ledger.reserve("a", "p", [0], *WHOLE, pod="ns/p", hold_ms=HOLD)
    assert a.ok and b.ok and c.ok and c.existing
    # B's Binding may be in flight (its name lost with the list): C's give-back leaves the booking
    assert (await ledger.give_back("a", "p", c.bind_no, attempt=c.attempt))[0] == "kept"
    await assert_held_by_p(ledger)
