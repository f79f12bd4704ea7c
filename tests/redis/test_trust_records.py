"""Only our bind writes allocations: the ledger's side, on a real Redis (issue 11 item 1).

A bound reservation is what our extender booked and wrote with the Binding. A record changed after
that (grown from 2 units/1 core to 96/16, moved to another card) is not booked: `observe` and
`replace_node` with keep_bound keep the booking atomically, and the watchers and rebuilds pass it.
A record on a pod our scheduler does not place (a CPU pod, another scheduler's pod) books nothing.
The API server refuses such records in the first place (tests/e2e/test_trust.py); these are the
ledger's own defence for a cluster without the policy.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import REGISTRY

from controller.pod_watch import PodWatcher
from shared.config import Config
from shared.domain.annotations import ALLOCATED, PodUsage
from shared.domain.models import CardModel
from shared.kube import Kube
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis.helpers import S4000, dump, inventory, violations

pytestmark = pytest.mark.redis

CFG = Config(memory_per_card=(CardModel(S4000),))
GROWN = PodUsage("n4", (0,), 96, 16, 1)  # the forged record: the whole card
MOVED = PodUsage("n4", (1,), 2, 1, 1)  # the same slice on another card


async def booked_slice(led: Ledger, uid: str = "u1") -> None:
    """What our bind leaves: 2 units / 1 core on card 0, reserved then marked bound."""
    assert (await led.reserve("n4", uid, [0], 2, 1, 1, pod=f"ns/{uid}"))[0].ok
    assert await led.mark_bound("n4", uid)


@pytest.mark.parametrize("record", [GROWN, MOVED], ids=["grown", "moved"])
async def test_observe_keep_bound_refuses_to_replace_a_bound_booking(cluster: Ledger, record: PodUsage) -> None:
    led = cluster
    await booked_slice(led)
    before = await dump(led.redis)
    out = await led.observe("u1", record, "ns/u1", keep_bound=True)
    assert out["ok"] and out["kept"] and not out["changed"]
    assert out["booked"] == {"cards": "0", "mem": 2, "cores": 1, "slices": 1}  # what the watcher logs
    assert await dump(led.redis) == before  # not a key touched, the feed not even told
    # without the flag (the behaviour at c04b156) the record replaced the booking
    out = await led.observe("u1", record, "ns/u1")
    assert out["changed"] and not out.get("kept")
    s = await led.snapshot("n4")
    assert s is not None and s.reservations["u1"].cards == record.cards


async def test_observe_keep_bound_still_records_what_the_booking_says(cluster: Ledger) -> None:
    """The flag changes nothing for the records our bind writes: pending is confirmed, bound stays."""
    led = cluster
    assert (await led.reserve("n4", "u1", [0], 2, 1, 1, pod="ns/u1"))[0].ok
    same = PodUsage("n4", (0,), 2, 1, 1)
    assert await led.observe("u1", same, keep_bound=True) == {"ok": True, "changed": True, "overcommit": False}
    assert await led.observe("u1", same, keep_bound=True) == {"ok": True, "changed": False, "overcommit": False}
    # a pod new to the ledger (after a restart the watcher records it from the API): booked
    out = await led.observe("u2", PodUsage("n4", (1,), 8, 2, 1), "ns/u2", keep_bound=True)
    assert out["ok"] and out["changed"] and not out.get("kept")
    s = await led.snapshot("n4")
    assert s is not None and s.reservations["u1"].state == "bound" and s.cards[1].mem_used == 8


async def test_observe_keep_bound_lets_a_record_replace_a_pending_reservation(cluster: Ledger) -> None:
    """Pending: not (yet) confirmed by our bind, and the record the API server holds is the truth (a binder
    whose pending reservation expired and was re-made elsewhere while its Binding had gone through)."""
    led = cluster
    assert (await led.reserve("n4", "u1", [0], 2, 1, 1))[0].ok
    out = await led.observe("u1", MOVED, keep_bound=True)
    assert out["changed"] and not out.get("kept")
    s = await led.snapshot("n4")
    assert s is not None and s.reservations["u1"].cards == (1,) and s.cards[0].mem_used == 0


async def test_replace_node_keep_bound_keeps_the_booking_of_a_changed_record(cluster: Ledger) -> None:
    led = cluster
    await booked_slice(led, "u1")
    assert (await led.reserve("n4", "u2", [1], 8, 2, 1, pod="ns/u2"))[0].ok  # pending: the record wins
    holders = {"u1": (GROWN, "ns/u1"), "u2": (PodUsage("n4", (0,), 8, 2, 1), "ns/u2"),
               "u3": (PodUsage("n4", (1,), 4, 1, 1), "ns/u3")}
    out = await led.replace_node(inventory("n4", S4000), holders, keep_bound=True)
    assert out["kept_bound"] == ["u1"]
    s = await led.snapshot("n4")
    assert s is not None
    got = {u: (r.cards, r.mem, r.cores, r.state) for u, r in s.reservations.items()}
    assert got == {"u1": ((0,), 2, 1, "bound"), "u2": ((0,), 8, 2, "bound"), "u3": ((1,), 4, 1, "bound")}
    assert (s.cards[0].mem_used, s.cards[0].cores_used) == (10, 3) and violations(s) == []
    # without the flag the forged record is booked (c04b156: the reconciler's repair did this)
    out = await led.replace_node(inventory("n4", S4000), holders)
    assert out["kept_bound"] == []
    s = await led.snapshot("n4")
    assert s is not None and s.reservations["u1"].mem == 96


async def test_rebuild_over_live_state_keeps_bound_bookings(cluster: Ledger) -> None:
    """Every watcher start rebuilds from the API's records: the bookings Redis still holds win."""
    led = cluster
    await booked_slice(led, "u1")
    stats = await led.rebuild([inventory("n4", S4000)], {"u1": (GROWN, "ns/u1")}, keep_bound=True)
    assert stats["kept_bound"] == 1
    s = await led.snapshot("n4")
    assert s is not None and (s.reservations["u1"].mem, s.cards[0].mem_used) == (2, 2)
    # after a real loss the records are all there is: booked as they say
    await led.redis.flushall()
    await led.load_scripts()
    stats = await led.rebuild([inventory("n4", S4000)], {"u1": (GROWN, "ns/u1")}, keep_bound=True)
    assert stats["kept_bound"] == 0
    s = await led.snapshot("n4")
    assert s is not None and s.cards[0].mem_used == 96


# -- the watcher -----------------------------------------------------------------------------------

def pod(uid: str, record: str | None, *, scheduler: str = "hami-scheduler", slices: bool = True,
        node: str = "n4") -> dict[str, Any]:
    limits = {"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "2", "mthreads.com/sgpu-core": "1"} \
        if slices else {"cpu": "1"}
    meta: dict[str, Any] = {"name": uid, "namespace": "ns", "uid": uid}
    if record is not None:
        meta["annotations"] = {ALLOCATED: record}
    return {"metadata": meta, "spec": {"schedulerName": scheduler, "nodeName": node,
                                       "containers": [{"name": "c", "resources": {"limits": limits}}]},
            "status": {"phase": "Running"}}


def mismatches(kind: str) -> float:
    return REGISTRY.get_sample_value("mtsched_record_mismatch_total", {"kind": kind}) or 0.0


def watcher(led: Ledger) -> PodWatcher:
    # no API call is made by learn/record: the client is never used
    return PodWatcher(Kube(None), led, Mirror(led), CFG, asyncio.Event())  # type: ignore[arg-type]


async def test_watcher_keeps_our_booking_when_a_record_changes(cluster: Ledger) -> None:
    led = cluster
    await booked_slice(led, "u1")
    w = watcher(led)
    await w.on_event("MODIFIED", pod("u1", "n4-mthreads-0,Mthreads,1024,1:;"))  # what our bind wrote
    before, counted = await dump(led.redis), mismatches("changed")
    await w.on_event("MODIFIED", pod("u1", "n4-mthreads-0,Mthreads,49152,16:;"))  # grown to the whole card
    await w.on_event("MODIFIED", pod("u1", "n4-mthreads-1,Mthreads,1024,1:;"))  # moved to card 1
    assert await dump(led.redis) == before
    assert mismatches("changed") == counted + 2
    assert not w.lost.is_set()


@pytest.mark.parametrize(("name", "kwargs"), [("a CPU pod", {"slices": False}),
                                              ("a pod of another scheduler", {"scheduler": "volcano"}),
                                              ("a pod of default-scheduler", {"scheduler": ""})])
async def test_watcher_books_nothing_for_a_record_our_bind_never_wrote(cluster: Ledger, name: str,
                                                                       kwargs: dict[str, Any]) -> None:
    led = cluster
    w = watcher(led)
    forged = "n4-mthreads-0,Mthreads,49152,16:;"
    before, counted = await dump(led.redis), mismatches("foreign")
    p = pod("f1", forged, **kwargs)
    await w.on_event("ADDED", p)
    assert await dump(led.redis) == before, name
    assert mismatches("foreign") == counted + 1
    assert w.holders("n4") == {}  # and no node written from the view would book it either
    # the same record on our own pod is booked (the control)
    await w.on_event("ADDED", pod("o1", forged))
    s = await led.snapshot("n4")
    assert s is not None and list(s.reservations) == ["o1"] and s.cards[0].mem_used == 96
