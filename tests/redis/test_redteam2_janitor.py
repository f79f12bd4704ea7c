"""Red team on commit 6fd0143 (Janitor.before_expire = PodWatcher.confirm_now), each test failing before the fix.

The janitor handed `before_expire` the uids its mirror showed pending past the TTL at the sweep's `now`,
then `expire.lua` expired every pending booking of the node that Redis found past the TTL *when the script
ran*. Whatever the watcher held back between the two, whatever crossed the TTL meanwhile, or whatever
`confirm_now` failed to book, was expired under the running pod (until the deferred entry's due or the
reconciler booked it again). Now the janitor expires only the uids it vetted (`expire(only=...)`), minus those
the watcher still holds back or is confirming, and a record seen past half its booking's TTL is booked at once
(any replica's janitor may expire it). Real parts: redis-server, Ledger, Mirror, PodWatcher, Janitor.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

import pytest

from controller.janitor import Janitor
from controller.pod_watch import PodWatcher
from controller.watchers import janitor_for
from shared.domain.annotations import PodUsage
from shared.kube import Kube
from shared.store.ledger import Ledger, LedgerError
from shared.store.mirror import Mirror
from tests.redis.helpers import eventually
from tests.redis.test_watcher_records import CFG, pod, reserved

pytestmark = pytest.mark.redis


async def _age(led: Ledger, uid: str) -> int:
    s = await led.snapshot("n4")
    assert s is not None
    return await led.redis_time_ms() - s.reservations[uid].created


async def _aged(led: Ledger, uid: str, ms: int) -> None:
    async def old() -> bool:
        return await _age(led, uid) > ms

    await eventually(old, what=f"{uid} older than {ms} ms")


async def test_a_record_that_arrives_during_before_expire_is_kept(
        watched: tuple[Ledger, Mirror, PodWatcher]) -> None:
    """Two binds whose binder died; the watch lagged. u2's record is deferred before the sweep; u1's arrives
    while the janitor awaits confirm_now's observe of u2 (the event loop runs the watch handler meanwhile).
    u1 is deferred with a fresh due, not in the list confirm_due took, and expire.lua frees it."""
    led, mirror, w = watched
    await reserved(led, mirror, "u2")
    await reserved(led, mirror, "u1")
    await w.on_event("MODIFIED", pod("u2"))
    assert "u2" in w.deferred
    real = w.ledger.observe

    async def observe(uid: str, usage: PodUsage, ref: str = "", keep_bound: bool = False,
                      give_up: Any = None) -> dict[str, Any]:
        if uid == "u2":
            await w.on_event("MODIFIED", pod("u1"))  # u1's record, handled while this round trip is awaited
        return await real(uid, usage, ref, keep_bound, give_up)

    w.ledger.observe = observe  # type: ignore[method-assign,assignment]
    janitor = Janitor(led, mirror, CFG, before_expire=w.confirm_now)
    janitor.ttl = 1
    await _aged(led, "u1", 1000)
    gone = await janitor.sweep()
    s = await led.snapshot("n4")
    assert s is not None
    assert s.reservations["u2"].state == "bound"
    assert "u1" not in gone, "u1's record was held back by the watcher, and the janitor expired its booking"


async def test_a_booking_that_crosses_the_ttl_during_the_sweep_is_not_expired_unvetted(
        watched: tuple[Ledger, Mirror, PodWatcher]) -> None:
    """`old` is judged at the sweep's start (`now`, read once for every node); expire.lua judges at its own
    run, and expired every pending booking of the node, not only the uids given to before_expire. u1's record
    is held back and, at the sweep's `now`, u1 is under the TTL, so it is not handed to confirm_now; another
    booking of the node (udead: a binder that died, no record) makes the janitor call expire, which runs when
    u1 is past the TTL too (the round trips of the nodes swept before). Made deterministic: the sweep's `now`
    is read as it was 0.5 s after u1's reservation, and expire runs when both are really past the TTL."""
    led, mirror, w = watched
    await reserved(led, mirror, "udead")
    await _aged(led, "udead", 600)
    await reserved(led, mirror, "u1")
    await w.on_event("MODIFIED", pod("u1"))
    assert "u1" in w.deferred
    snap = await led.snapshot("n4")
    assert snap is not None
    created = snap.reservations["u1"].created
    handed: list[str] = []

    async def before_expire(uids: list[str]) -> Any:
        handed.extend(uids)
        return await w.confirm_now(uids)

    janitor = Janitor(led, mirror, CFG, before_expire=before_expire)
    janitor.ttl = 1
    await _aged(led, "u1", 1000)  # expire.lua, when it runs, finds both past the TTL

    async def then() -> int:  # the sweep's `now`, as read before the nodes swept ahead of this one
        return created + 500

    janitor.ledger = replace_time(led, then)
    gone = await janitor.sweep()
    assert handed == ["udead"]
    assert "udead" in gone
    assert "u1" not in gone, "expire.lua freed u1, which before_expire was never asked about"


def replace_time(led: Ledger, now: Any) -> Ledger:
    """A ledger client of the same Redis whose redis_time_ms answers `now()`."""
    other = Ledger(led.redis)
    other.redis_time_ms = now  # type: ignore[method-assign]
    return other


async def test_a_failed_confirm_now_keeps_the_booking(
        watched: tuple[Ledger, Mirror, PodWatcher]) -> None:
    """observe answered with a script error (LedgerError: BUSY, OOM, NOREPLICAS are
    ResponseErrors, not among the ledger's RESEND ones) that had passed by the time expire ran: _observe logs
    and returns, confirm_due counts it sent and drops the entry (seen not set), and the sweep goes on to
    expire the booking. Nothing books it again until the pod's next event or the reconciler's pass (30 s)."""
    led, mirror, w = watched
    await reserved(led, mirror, "u1")
    await w.on_event("MODIFIED", pod("u1"))
    calls = 0
    real = w.ledger.observe

    async def observe(uid: str, usage: PodUsage, ref: str = "", keep_bound: bool = False,
                      give_up: Any = None) -> dict[str, Any]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise LedgerError("observe on n4: BUSY Redis is busy running a script")
        return await real(uid, usage, ref, keep_bound, give_up)

    w.ledger.observe = observe  # type: ignore[method-assign,assignment]
    janitor = Janitor(led, mirror, CFG, before_expire=w.confirm_now)
    janitor.ttl = 1
    await _aged(led, "u1", 1000)
    try:
        gone = await janitor.sweep()
    except LedgerError:
        gone = []  # failing closed by raising would do too
    assert calls == 1
    assert "u1" not in gone, "confirm_now could not book u1, and the sweep expired it anyway"
    assert "u1" in w.deferred, "the record was dropped: nothing retries it"


async def test_the_unwired_control_is_a_window_not_a_loss(watched: tuple[Ledger, Mirror, PodWatcher]) -> None:
    """For the severity: without before_expire the deferred entry books the pod again at its due (<= grace
    after the record was seen), over-committing if the nudged scheduler placed another pod there meanwhile."""
    led, mirror, w = watched
    await reserved(led, mirror, "u1")
    await w.on_event("MODIFIED", pod("u1"))
    janitor = Janitor(led, mirror, CFG)
    janitor.ttl = 1
    await _aged(led, "u1", 1000)
    assert await janitor.sweep() == ["u1"]
    await eventually(lambda: "u1" not in mirror.nodes["n4"].reservations, what="the mirror saw the expiry")
    assert await w.confirm_due(time.monotonic() + w.bound_grace) == 1
    s = await led.snapshot("n4")
    assert s is not None and s.reservations["u1"].state == "bound"


async def test_a_record_seen_past_half_the_ttl_is_booked_at_once_for_any_replicas_janitor(
        watched: tuple[Ledger, Mirror, PodWatcher]) -> None:
    """Two watcher replicas. B saw the record late in the booking's TTL (its watch lagged) and holds it back for
    its grace; A has not seen it yet (its watch lags more). A's janitor asks A's watcher (confirm_now: nothing
    held) and expires the booking. A record seen past half the TTL must be sent at once instead (5 s TTL here:
    the least the config takes)."""
    led, mirror, b = watched
    cfg = replace(CFG, pending_ttl_seconds=5)
    b = PodWatcher(Kube(None), b.ledger, mirror, cfg, asyncio.Event())  # type: ignore[arg-type]
    a = PodWatcher(Kube(None), Ledger(led.redis), mirror, cfg, asyncio.Event())  # type: ignore[arg-type]
    await reserved(led, mirror, "u1")
    await _aged(led, "u1", 2600)  # past half the TTL
    await b.on_event("MODIFIED", pod("u1"))
    janitor_a = Janitor(led, mirror, cfg, before_expire=a.confirm_now)
    await _aged(led, "u1", 5000)
    assert "u1" not in await janitor_a.sweep(), "A's janitor expired the booking B held back"


async def test_a_sweep_during_a_relist_keeps_held_back_records(
        watched: tuple[Ledger, Mirror, PodWatcher]) -> None:
    """on_sync empties `truth` and refills it pod by pod, awaiting a round trip for each pod it must book. A
    sweep meanwhile: confirm_now forces u1 due, confirm_due finds no truth for it yet and drops the entry, and
    expire frees the booking (booked again only when the re-list reaches u1)."""
    led, mirror, w = watched
    await reserved(led, mirror, "u1")
    await w.on_event("MODIFIED", pod("u1"))
    assert "u1" in w.deferred
    janitor = Janitor(led, mirror, CFG, before_expire=w.confirm_now)
    janitor.ttl = 1
    await _aged(led, "u1", 1000)
    real = w.ledger.observe
    gone: list[str] = []

    async def observe(uid: str, usage: PodUsage, ref: str = "", keep_bound: bool = False,
                      give_up: Any = None) -> dict[str, Any]:
        if uid == "ux" and not gone:
            gone.extend(await janitor.sweep())  # the janitor's sweep runs while the re-list awaits this
        return await real(uid, usage, ref, keep_bound, give_up)

    w.ledger.observe = observe  # type: ignore[method-assign,assignment]
    other = pod("ux", "n4-mthreads-1,Mthreads,1024,1:;")  # a pod the ledger lacks: booked by the re-list
    await w.on_sync([other, pod("u1")])
    assert "u1" not in gone, "the sweep during the re-list expired a record the watcher held back"


async def test_the_watcher_roles_janitor_is_wired_to_its_pod_watcher(
        watched: tuple[Ledger, Mirror, PodWatcher]) -> None:
    """What controller/roles.py runs (janitor_for): without before_expire the janitor expires held-back
    records' bookings, without redis_time `_late` judges ages on this host's clock alone."""
    led, mirror, w = watched
    j = janitor_for(led, mirror, CFG, w)
    assert j.before_expire == w.confirm_now and j.redis_time == w.saw_redis_time and j.nudger is w.nudger
    assert j.api_holds == w.api_holds  # (tests/redis/test_redteam_janitor_lagging_view.py)
    w.reflector._failing(OSError("connection reset"))  # the pod view it waits for (test_redteam_janitor_blind.py)
    assert "connection reset" in j.view_problem()
    w.reflector._working()
    w.redis_clock = (10**15, 0.0)  # a stale reading: the sweep must replace it with its own of Redis's clock
    await j.sweep()
    assert w.redis_clock is not None and abs(w.redis_now_ms() - await led.redis_time_ms()) < 60_000
