"""Red team on the pod watcher's deferred records (issue 14, commit 0e69115).

A bound pod whose booking the mirror shows pending waits up to `bound_grace` for our bind's confirmation,
then `confirm_due` sends `observe`. Attacks: (1) the pod's next events (status updates, which follow a
Binding closely) must not push that moment further each time, else a binder that died before confirming
leaves the booking pending until the janitor expires it under a running pod; (2) an `observe` that fails
(Redis gone longer than the ledger's retries) must leave the record due, as the event path does (the
reflector replays an event whose handling failed): the supervisor restarts the loop, and it must find the
record again. Real parts: redis-server, Ledger, Mirror, PodWatcher, Janitor.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest
from redis import exceptions as rexc

from controller.janitor import Janitor
from controller.pod_watch import PodWatcher
from shared.domain.annotations import PodUsage
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis.helpers import eventually
from tests.redis.test_watcher_records import CFG, pod, reserved, state

pytestmark = pytest.mark.redis


def status_update(p: dict[str, Any], n: int) -> dict[str, Any]:
    """The same pod, same record, a newer status (the kubelet's updates after a Binding)."""
    return {**p, "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "n": n}]}}


async def test_a_pods_next_events_do_not_postpone_its_confirmation(watched: tuple[Ledger, Mirror, PodWatcher]) -> None:
    led, mirror, w = watched
    await reserved(led, mirror, "u1")  # the binder died before mark_bound
    p = pod("u1")
    await w.on_event("MODIFIED", p)
    first_due = time.monotonic() + w.bound_grace  # no earlier than the record's due
    await asyncio.sleep(0.05)
    await w.on_event("MODIFIED", status_update(p, 1))  # the same record again
    assert await w.confirm_due(first_due) == 1, "the second event moved the record's due later"
    s = await led.snapshot("n4")
    assert s is not None and s.reservations["u1"].state == "bound"


async def test_a_relist_does_not_postpone_it_either(watched: tuple[Ledger, Mirror, PodWatcher]) -> None:
    led, mirror, w = watched
    await reserved(led, mirror, "u1")
    p = pod("u1")
    await w.on_event("MODIFIED", p)
    first_due = time.monotonic() + w.bound_grace
    await asyncio.sleep(0.05)
    await w.on_sync([status_update(p, 1)])
    assert await w.confirm_due(first_due) == 1, "the re-list moved the record's due later"


async def test_a_binder_that_died_under_a_busy_pod_is_not_expired(watched: tuple[Ledger, Mirror, PodWatcher]) -> None:
    """Events every 0.1 s, grace 0.3 s: the confirmation loop must confirm the booking before the janitor
    (a 1 s TTL here) finds it pending past its TTL and frees a share the running pod holds."""
    led, mirror, w = watched
    w.bound_grace = 0.3
    await reserved(led, mirror, "u1")
    p = pod("u1")
    loop = asyncio.create_task(w.confirm_deferred())
    try:
        t0 = time.monotonic()
        n = 0
        while time.monotonic() - t0 < 1.6:
            await w.on_event("MODIFIED", status_update(p, n))
            n += 1
            await asyncio.sleep(0.1)
    finally:
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop
    janitor = Janitor(led, mirror, CFG)
    janitor.ttl = 1
    assert await janitor.sweep() == [], "the janitor expired the booking of a bound pod"
    s = await led.snapshot("n4")
    assert s is not None and s.reservations["u1"].state == "bound"


async def test_a_failed_observe_leaves_the_record_due(watched: tuple[Ledger, Mirror, PodWatcher]) -> None:
    led, mirror, w = watched
    await reserved(led, mirror, "u1")
    await w.on_event("MODIFIED", pod("u1"))
    real = w.ledger.observe
    calls = 0

    async def observe(uid: str, usage: PodUsage, pod: str = "", keep_bound: bool = False,
                      give_up: Any = None) -> dict[str, Any]:
        nonlocal calls
        calls += 1
        if calls == 1:  # Redis gone for longer than the ledger's own retries
            raise rexc.ConnectionError("Connection refused")
        return await real(uid, usage, pod, keep_bound, give_up)

    w.ledger.observe = observe  # type: ignore[method-assign]
    due = time.monotonic() + w.bound_grace
    with pytest.raises(rexc.ConnectionError):
        await w.confirm_due(due)  # the supervisor logs it and runs the loop again
    assert await w.confirm_due(due) == 1, "the record was dropped with the failed call"
    await eventually(lambda: state(mirror, "u1") == "bound", what="the watcher confirmed the booking")


async def test_a_pod_released_while_its_observe_failed_is_not_booked(
        watched: tuple[Ledger, Mirror, PodWatcher]) -> None:
    """What the failed call leaves due is judged again: a pod deleted meanwhile is not booked."""
    led, mirror, w = watched
    await reserved(led, mirror, "u1")
    p = pod("u1")
    await w.on_event("MODIFIED", p)

    async def observe(uid: str, usage: PodUsage, pod: str = "", keep_bound: bool = False,
                      give_up: Any = None) -> dict[str, Any]:
        await w.on_event("DELETED", p)  # the pod went while the call hung
        raise rexc.ConnectionError("Connection refused")

    real = w.ledger.observe
    w.ledger.observe = observe  # type: ignore[method-assign]
    due = time.monotonic() + w.bound_grace
    with pytest.raises(rexc.ConnectionError):
        await w.confirm_due(due)
    for task in list(w.nudger._tasks):  # the release's nudge (no API here)
        task.cancel()
    w.ledger.observe = real  # type: ignore[method-assign]
    assert await w.confirm_due(due) == 0
    assert not w.deferred
    s = await led.snapshot("n4")
    assert s is not None and "u1" not in s.reservations


async def _aged(led: Ledger, uid: str, ttl: int) -> None:
    """Until the booking is older than `ttl` s on Redis's clock, the janitor's."""
    s = await led.snapshot("n4")
    assert s is not None
    created = s.reservations[uid].created

    async def old() -> bool:
        return await led.redis_time_ms() - created > ttl * 1000

    await eventually(old, what="the booking is past its TTL")


@pytest.mark.parametrize("wired", [True, False])
async def test_a_record_seen_late_in_its_ttl_is_booked_before_the_janitor_expires_it(
        watched: tuple[Ledger, Mirror, PodWatcher], wired: bool) -> None:
    """The watch lagged: the record arrives when the pending booking is almost at its TTL, and the binder died
    before confirming. The record waits its grace for a confirmation that never comes, and the janitor's next
    sweep would free a share the running pod holds. Wired as the watcher role wires it (controller/roles.py),
    the janitor has the watcher book those records first; unwired (the control), the booking is expired."""
    led, mirror, w = watched
    await reserved(led, mirror, "u1")
    await w.on_event("MODIFIED", pod("u1"))
    assert "u1" in w.deferred  # held back for the bind's confirmation
    janitor = Janitor(led, mirror, CFG, before_expire=w.confirm_now if wired else None)
    janitor.ttl = 1  # the least the expire script takes
    await _aged(led, "u1", janitor.ttl)
    gone = await janitor.sweep()
    s = await led.snapshot("n4")
    assert s is not None
    if wired:
        assert gone == [] and s.reservations["u1"].state == "bound" and not w.deferred
    else:
        assert gone == ["u1"] and "u1" not in s.reservations
