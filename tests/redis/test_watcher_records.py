"""The pod watcher sends `observe` only when the ledger may lack what a bound pod's record says (issue 14).

Our bind books a pod (pending), writes the Binding with the record, and confirms the booking (bound) a
moment later. The watcher sees the record about then: when its mirror shows that very booking bound, it
makes no round trip; pending, it waits up to `bound_grace` for the bind's confirmation and sends `observe`
only if none came (a binder that died after its Binding). Anything else (no booking, another one, a
changed record) is sent at once, as before. Real parts: redis-server, Ledger, Mirror and PodWatcher.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest
from prometheus_client import REGISTRY

from controller.pod_watch import BOUND_GRACE, PodWatcher
from shared.config import Config
from shared.domain.annotations import ALLOCATED
from shared.kube import Kube
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis.conftest import WATCHER_CFG
from tests.redis.helpers import S4000, eventually, inventory

pytestmark = pytest.mark.redis

CFG = WATCHER_CFG
RECORD = "n4-mthreads-0,Mthreads,1024,1:;"  # 2 units (512 MiB each) and 1 core on card 0 of n4


def pod(uid: str, record: str = RECORD) -> dict[str, Any]:
    limits = {"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "2", "mthreads.com/sgpu-core": "1"}
    return {"metadata": {"name": uid, "namespace": "ns", "uid": uid, "annotations": {ALLOCATED: record}},
            "spec": {"schedulerName": "hami-scheduler", "nodeName": "n4",
                     "containers": [{"name": "c", "resources": {"limits": limits}}]},
            "status": {"phase": "Pending"}}


def records(outcome: str) -> float:
    return REGISTRY.get_sample_value("mtsched_records_total", {"outcome": outcome}) or 0.0


async def reserved(led: Ledger, mirror: Mirror, uid: str) -> None:
    """What our bind leaves before its confirmation: the booking pending, seen by the mirror."""
    assert (await led.reserve("n4", uid, [0], 2, 1, 1, pod=f"ns/{uid}"))[0].ok
    await eventually(lambda: uid in (mirror.nodes["n4"].reservations if "n4" in mirror.nodes else {}),
                     what="the mirror shows the reservation")


def state(mirror: Mirror, uid: str) -> str:
    r = mirror.nodes["n4"].reservations.get(uid)
    return r.state if r is not None else ""


async def test_a_booking_the_mirror_shows_bound_costs_no_round_trip(watched: tuple[Ledger, Mirror, PodWatcher]) -> None:
    led, mirror, w = watched
    await reserved(led, mirror, "u1")
    assert await led.mark_bound("n4", "u1")
    await eventually(lambda: state(mirror, "u1") == "bound", what="the mirror shows it bound")
    trips, skipped = w.ledger.round_trips, records("already_bound")
    await w.on_event("MODIFIED", pod("u1"))
    assert w.ledger.round_trips == trips  # not one call
    assert records("already_bound") == skipped + 1
    assert w.seen.get("u1") is not None and not w.deferred
    # the same pod again (a resync, a status update): nothing either
    await w.on_event("MODIFIED", pod("u1"))
    assert w.ledger.round_trips == trips


async def test_a_pending_booking_waits_for_the_binds_confirmation(watched: tuple[Ledger, Mirror, PodWatcher]) -> None:
    led, mirror, w = watched
    await reserved(led, mirror, "u1")
    trips = w.ledger.round_trips
    await w.on_event("MODIFIED", pod("u1"))
    assert "u1" in w.deferred and w.ledger.round_trips == trips  # waiting, not sent
    assert await w.confirm_due() == 0 and "u1" in w.deferred  # not due yet
    assert await led.mark_bound("n4", "u1")  # the bind confirms it
    await eventually(lambda: state(mirror, "u1") == "bound", what="the mirror shows it bound")
    skipped = records("already_bound")
    assert await w.confirm_due(time.monotonic() + w.bound_grace) == 0
    assert w.ledger.round_trips == trips and not w.deferred and w.seen.get("u1") is not None
    assert records("already_bound") == skipped + 1


async def test_a_binder_that_never_confirms_is_confirmed_by_the_watcher(
        watched: tuple[Ledger, Mirror, PodWatcher]) -> None:
    led, mirror, w = watched
    await reserved(led, mirror, "u1")
    await w.on_event("MODIFIED", pod("u1"))
    observed = records("observed")
    assert await w.confirm_due(time.monotonic() + w.bound_grace) == 1
    assert records("observed") == observed + 1 and not w.deferred
    s = await led.snapshot("n4")
    assert s is not None and s.reservations["u1"].state == "bound"
    assert (s.cards[0].mem_used, s.cards[0].cores_used, s.cards[0].slices) == (2, 1, 1)  # booked once


async def test_the_supervised_loop_confirms_in_time(watched: tuple[Ledger, Mirror, PodWatcher]) -> None:
    led, mirror, w = watched
    w.bound_grace = 0.2
    await reserved(led, mirror, "u1")
    await w.on_event("MODIFIED", pod("u1"))
    assert "u1" in w.deferred
    task = asyncio.create_task(w.confirm_deferred())
    try:
        await eventually(lambda: state(mirror, "u1") == "bound", what="the watcher confirmed the booking")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert not w.deferred


@pytest.mark.parametrize(("what", "record"), [
    ("another card", "n4-mthreads-1,Mthreads,1024,1:;"),
    ("more memory", "n4-mthreads-0,Mthreads,2048,1:;"),
    ("more cores", "n4-mthreads-0,Mthreads,1024,2:;"),
])
async def test_a_record_unlike_the_booking_is_sent_at_once(watched: tuple[Ledger, Mirror, PodWatcher], what: str,
                                                           record: str) -> None:
    """Bound or pending, a booking that is not the record's never spares the call: bound, the ledger keeps
    it and says the record changed after our bind; pending, the record is booked."""
    led, mirror, w = watched
    await reserved(led, mirror, "ub")
    assert await led.mark_bound("n4", "ub")
    await eventually(lambda: state(mirror, "ub") == "bound", what="the mirror shows it bound")
    changed = REGISTRY.get_sample_value("mtsched_record_mismatch_total", {"kind": "changed"}) or 0.0
    trips = w.ledger.round_trips
    await w.on_event("MODIFIED", pod("ub", record))
    assert w.ledger.round_trips > trips, what  # sent (a script that needs more keys takes two)
    assert REGISTRY.get_sample_value("mtsched_record_mismatch_total", {"kind": "changed"}) == changed + 1
    await reserved(led, mirror, "up")  # pending on card 0 (2 units, 1 core): the record says otherwise
    trips = w.ledger.round_trips
    await w.on_event("MODIFIED", pod("up", record))
    assert "up" not in w.deferred and w.ledger.round_trips > trips, what
    s = await led.snapshot("n4")  # pending: the record is the truth, booked as it says
    assert s is not None and s.reservations["up"].state == "bound", what


async def test_no_booking_in_the_mirror_is_sent_at_once(watched: tuple[Ledger, Mirror, PodWatcher]) -> None:
    """After a Redis loss, or a pod bound while the ledger had no booking: observe books the record."""
    led, _, w = watched
    await w.on_event("ADDED", pod("u9"))
    assert not w.deferred
    s = await led.snapshot("n4")
    assert s is not None and s.reservations["u9"].state == "bound"


async def test_a_pod_deleted_while_waiting_is_not_booked(watched: tuple[Ledger, Mirror, PodWatcher]) -> None:
    led, mirror, w = watched
    await reserved(led, mirror, "u1")
    p = pod("u1")
    await w.on_event("MODIFIED", p)
    assert "u1" in w.deferred
    await w.on_event("DELETED", p)
    for task in list(w.nudger._tasks):  # the release's nudge of kube-scheduler (no API here): not left behind
        task.cancel()
    assert not w.deferred
    assert await w.confirm_due(time.monotonic() + 3600) == 0
    s = await led.snapshot("n4")
    assert s is not None and "u1" not in s.reservations and s.cards[0].mem_used == 0


async def test_a_relist_starts_over(watched: tuple[Ledger, Mirror, PodWatcher]) -> None:
    """On a re-list every pod is judged again from the list, the waiting ones too."""
    led, mirror, w = watched
    await reserved(led, mirror, "u1")
    await w.on_event("MODIFIED", pod("u1"))
    assert await led.mark_bound("n4", "u1")
    await eventually(lambda: state(mirror, "u1") == "bound", what="the mirror shows it bound")
    trips = w.ledger.round_trips
    await w.on_sync([pod("u1")])
    assert not w.deferred and w.ledger.round_trips == trips  # bound by then: no call on the re-list


def test_the_grace_is_far_inside_the_pending_ttl() -> None:
    for ttl in (5, 8, 120):
        w = PodWatcher(Kube(None), None, None, Config(pending_ttl_seconds=ttl), asyncio.Event())  # type: ignore[arg-type]
        assert 0 < w.bound_grace <= ttl / 4 and w.bound_grace <= BOUND_GRACE


async def test_the_node_in_the_mirror_is_the_records_node(cluster: Ledger) -> None:
    """A booking of the uid on another node is not the record's: sent at once."""
    led = cluster
    mirror = Mirror(led)
    await mirror.start()
    await asyncio.wait_for(mirror.ready.wait(), 5)
    try:
        await led.upsert_node(inventory("n6", S4000))
        assert (await led.reserve("n6", "u1", [0], 2, 1, 1))[0].ok
        assert await led.mark_bound("n6", "u1")
        await eventually(lambda: "u1" in (mirror.nodes["n6"].reservations if "n6" in mirror.nodes else {}),
                         what="the mirror shows the booking on n6")
        w = PodWatcher(Kube(None), Ledger(led.redis), mirror, CFG, asyncio.Event())  # type: ignore[arg-type]
        trips = w.ledger.round_trips
        await w.on_event("MODIFIED", pod("u1"))  # its record says n4
        assert w.ledger.round_trips > trips and not w.deferred
    finally:
        await mirror.stop()

