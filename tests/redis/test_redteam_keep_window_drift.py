"""Red team (the keep window counted from the wrong instant): a rebuild writes every node from the API's truth and
keeps what was made or bound since that truth was read (`keep_ms`: the watchers' keep window plus the time the lists
took). It passed that one duration to each node's `replace_node`, which counts it back from the moment its script
runs: a rebuild over many nodes (two round trips each, more with MOREKEYS; a fleet of thousands, or a few resends
on the way) reached its last nodes later than the window, and there dropped a booking bound after the lists were
read, which they do not hold: its pod runs on the card, and the ledger offered the card to the next pod. The same for
one `replace_node` (or `remove_node`) whose reply was lost and that the ledger sent again seconds later.

Now the window counts back from the call: each node's write, and each send, carries keep_ms plus the time elapsed
since (ours: fine for a duration, as the reconciler's own list time).

Real parts: redis-server, the Ledger, the scripts. Time passes by waiting on Redis's clock, not by sleeping."""

from __future__ import annotations

from typing import Any

import pytest
from redis import exceptions as rexc

from shared.store.ledger import KEEP_MS_MAX, Ledger
from tests._wait import eventually
from tests.redis.helpers import S4000, inventory, violations

pytestmark = pytest.mark.redis
KEEP_MS = 300
WHOLE = (96, 16, 1)


async def redis_ms(led: Ledger) -> int:
    secs, micros = await led.redis.time()
    return int(secs) * 1000 + int(micros) // 1000


async def past_window(led: Ledger, since: int) -> None:
    """Wait until Redis's clock is more than the keep window past `since`."""
    async def passed() -> bool:
        return await redis_ms(led) > since + KEEP_MS + 50
    await eventually(passed, within=10, what="Redis's clock past the keep window")


async def bound_booking(led: Ledger, node: str, uid: str) -> int:
    """A whole card of `node` booked and bound for `uid`; its bound_at."""
    assert (await led.reserve(node, uid, [0], *WHOLE, pod=f"ns/{uid}"))[0].ok
    assert await led.mark_bound(node, uid)
    return (await led.snapshots([node]))[node].reservations[uid].bound_at


async def test_a_rebuild_reaching_a_node_late_keeps_what_was_bound_after_its_truth(ledger: Ledger) -> None:
    a, b = inventory("a", S4000), inventory("b", S4000)
    await ledger.upsert_node(a)
    await ledger.upsert_node(b)
    bound_at = await bound_booking(ledger, "b", "q")  # bound after the rebuild's lists were read: not in `bound`
    real = ledger.list_node

    async def slow(node: str) -> int:
        if node == "b":  # the nodes before it took longer than the window
            await past_window(ledger, bound_at)
        return await real(node)

    ledger.list_node = slow  # type: ignore[method-assign]
    await ledger.rebuild([a, b], {}, keep_ms=KEEP_MS, keep_bound=True)
    snap = (await ledger.snapshots(["b"]))["b"]
    assert "q" in snap.reservations and not violations(snap)
    assert not (await ledger.reserve("b", "r", [0], *WHOLE, pod="ns/r"))[0].ok  # the card is still q's


async def test_a_replace_sent_again_after_its_reply_was_lost_keeps_what_was_bound_meanwhile(ledger: Ledger) -> None:
    inv = inventory("b", S4000)
    await ledger.upsert_node(inv)
    real = ledger._scripts["replace_node"]
    lost: list[int] = []

    async def run(keys: Any = None, args: Any = None, client: Any = None) -> Any:
        out = await real(keys, args)
        if not lost:  # the first run wrote the node; before its reply, q is booked and bound, and time passes
            lost.append(await bound_booking(ledger, "b", "q"))
            await past_window(ledger, lost[0])
            raise rexc.TimeoutError("Timeout reading from socket")
        return out

    ledger._scripts["replace_node"] = run  # type: ignore[assignment]
    out = await ledger.replace_node(inv, {}, keep_ms=KEEP_MS, keep_bound=True)
    assert lost and out["dropped"] == 0
    snap = (await ledger.snapshots(["b"]))["b"]
    assert "q" in snap.reservations and not violations(snap)


async def test_the_longest_keep_window_sent_again_is_not_refused(ledger: Ledger,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The watchers keep everything (KEEP_MS_MAX, a day) while their pod view is stale; counted back from the call
    it must stay within what the scripts take, or a resend (or a second MOREKEYS round) is refused as BADINPUT."""
    monkeypatch.setattr("shared.store.ledger._since", lambda _started: 5_000)  # as on a send 5 s after the call
    await ledger.upsert_node(inventory("k", S4000, n=1))
    await ledger.replace_node(inventory("k", S4000, n=1), {}, KEEP_MS_MAX)
    await ledger.upsert_node(inventory("k2", S4000, n=1))
    assert await ledger.remove_node("k2", KEEP_MS_MAX) is True
