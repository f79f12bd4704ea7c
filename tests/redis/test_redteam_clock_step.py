"""Red team, clocks: Redis's clock steps back (an NTP step, a VM restored, a host clock corrected) while a bind is
in flight, on a server that stays the master (no failover: the node stays verified, nothing is fenced).

Every stamp of a booking is Redis's clock. A booking made just before the step carries `created` and `settle_by`
(its Binding's deadline plus the settle time, reserve's hold_ms) more than FUTURE_MS (60 s) after the stepped
clock's "now". `expires` and `settles` (and their Lua twins) took such a stamp for "a clock that jumped: its age
cannot be told" and judged the booking at once: the janitor expired it at its next sweep (in_flight counts no
settle_by that far ahead), and replace_node dropped it as settled when the pass's view lacked its pod. Its
Binding was still in flight: the card went to the next pod, and the Binding then committed the first one on it,
two pods over the card. Simulated by moving the booking's stamps ahead by the step (what a step back of the
clock does to them); the scripts read the real TIME. Now a pending booking whose stamp is from the future is
restamped at the script's now by the janitor's expire (expired a TTL later, when its Binding is committed or
never) and settles meanwhile."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis

from controller.janitor import Janitor
from controller.node_watch import NodeWatcher
from controller.pod_watch import PodWatcher
from controller.reconciler import Reconciler
from controller.watchers import wire
from shared.kube import KubeError
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis.helpers import S4000, inventory
from tests.redis.test_redteam_inflight_nodes import CFG, KEEP_MS

pytestmark = pytest.mark.redis

STEP_MS = 5 * 60_000  # Redis's clock steps back 5 minutes
HOLD_MS = 6_000  # the extender's hold: a 5 s Binding deadline and 1 s to settle


async def step_back(redis: Redis, ledger: Ledger, node: str, uid: str, ms: int) -> None:
    """What a step back of `ms` of Redis's clock does to a booking made before it: its stamps lie `ms` ahead."""
    key = ledger.keys.res(node, uid)
    created, settle_by = await redis.hmget(key, ["created", "settle_by"])  # type: ignore[misc]
    await redis.hset(key, mapping={"created": int(created) + ms, "settle_by": int(settle_by) + ms})  # type: ignore[misc]


async def booked_in_flight(ledger: Ledger, redis: Redis, node: str) -> None:
    """A node of one S4000 card, and a bind's booking of all of it whose Binding is in flight (hold_ms)."""
    await ledger.upsert_node(inventory(node, S4000, n=1))
    out, _ = await ledger.reserve(node, "p1", [0], S4000, 16, 1, pod="ns/p1", hold_ms=HOLD_MS)
    assert out.ok and out.settle_by
    await step_back(redis, ledger, node, "p1", STEP_MS)


async def test_the_janitor_keeps_a_booking_in_flight_when_redis_clock_steps_back(
        ledger: Ledger, redis_client: Redis) -> None:
    await booked_in_flight(ledger, redis_client, "cs1")
    mirror = Mirror(ledger)
    await mirror.resync(full=True)
    assert "p1" in mirror.nodes["cs1"].reservations
    janitor = Janitor(ledger, mirror, CFG)
    assert await janitor.sweep() == [], "the janitor expired a booking whose Binding is in flight"
    taken, _ = await ledger.reserve("cs1", "p2", [0], S4000, 16, 1, pod="ns/p2", hold_ms=HOLD_MS)
    assert not taken.ok, "a second pod booked the card p1's Binding is about to take: two pods over one card"
    # it still ends, a TTL after the janitor first found it stamped ahead (its binder may have died)
    key = ledger.keys.res("cs1", "p1")
    created = int(await redis_client.hget(key, "created"))  # type: ignore[misc]
    assert created <= await ledger.redis_time_ms(), "restamped at the script's now"
    await redis_client.hset(key, "created", created - CFG.pending_ttl_seconds * 1000 - 1000)  # type: ignore[misc]
    assert await janitor.sweep() == ["p1"]  # (offered as the mirror's copy, stamped ahead: the script judges)


async def test_a_repair_keeps_a_booking_in_flight_when_redis_clock_steps_back(
        ledger: Ledger, redis_client: Redis) -> None:
    """The reconciler writes the node from a view that lacks the pod (not bound yet): the booking settles."""
    await booked_in_flight(ledger, redis_client, "cs2")
    now = await ledger.redis_time_ms()
    out = await ledger.replace_node(inventory("cs2", S4000, n=1), {}, KEEP_MS, keep_bound=True,
                                    keep_from=now - KEEP_MS)
    snap = await ledger.snapshot("cs2")
    assert snap is not None and "p1" in snap.reservations, f"the repair dropped the booking in flight: {out}"
    assert await ledger.remove_node("cs2", KEEP_MS) is None, "a node with a booking in flight was forgotten"


class OnePod:
    """The API as the reconciler asks it about a booking no holder explains: pod ns/p1, unbound (its Binding in
    flight), or gone (404)."""

    def __init__(self, exists: bool) -> None:
        self.exists = exists

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        raise AssertionError(f"unexpected {method} {path}")

    async def get_pod(self, ns: str, name: str) -> Any:
        assert (ns, name) == ("ns", "p1")
        if not self.exists:
            raise KubeError(404, {"message": "not found"}, f"GET pod {ns}/{name}")
        return {"metadata": {"name": "p1", "namespace": "ns", "uid": "p1"}, "spec": {"schedulerName": "x"},
                "status": {"phase": "Pending"}}


@pytest.mark.parametrize("exists", [True, False], ids=["its pod unbound: a Binding in flight", "its pod gone"])
async def test_the_reconciler_asks_before_freeing_a_booking_stamped_ahead(ledger: Ledger, redis_client: Redis,
                                                                         exists: bool) -> None:
    """A pass whose view lacks the pod: a booking stamped ahead is kept while its pod is there unbound (the
    janitor's: it expires a TTL after it is stamped anew), and freed at once once its pod is gone (an edit, or
    a failover to a server behind: tests/e2e/test_redteam_drift.py)."""
    kube = OnePod(exists)
    nodes = NodeWatcher(kube, ledger, CFG, keep_ms=KEEP_MS)  # type: ignore[arg-type]
    cap = {"mthreads.com/sgpu-core": "16", "mthreads.com/sgpu-memory": str(S4000)}
    await nodes.on_event("ADDED", {"metadata": {"name": "cs3"}, "status": {"capacity": cap, "allocatable": cap}})
    out, _ = await ledger.reserve("cs3", "p1", [0], S4000, 16, 1, pod="ns/p1", hold_ms=HOLD_MS)
    assert out.ok
    await step_back(redis_client, ledger, "cs3", "p1", STEP_MS)
    pods = PodWatcher(kube, ledger, Mirror(ledger), CFG, nodes.lost)  # type: ignore[arg-type]
    wire(nodes, pods)
    await Reconciler(kube, ledger, CFG, nodes, pods).reconcile_all()  # type: ignore[arg-type]
    snap = await ledger.snapshot("cs3")
    assert snap is not None
    assert ("p1" in snap.reservations) is exists, snap.reservations
    taken, _ = await ledger.reserve("cs3", "p2", [0], S4000, 16, 1, pod="ns/p2")
    assert taken.ok is not exists, "two pods over one card" if exists else "the card of no pod stayed booked"


async def test_a_node_fenced_when_redis_clock_steps_back_is_verified_a_keep_window_later(
        ledger: Ledger, redis_client: Redis) -> None:
    """Redis restarts with its data (a new history: every node unverified, no booking until the watchers have
    compared it a keep window after their first comparison), and its clock steps back an hour just after (a host
    that booted with its clock ahead, NTP stepping it once Redis ran). The window's start, stamped before the
    step, lay an hour ahead: no read could be `keep window` after it for an hour, and the node booked nothing
    meanwhile. Now a start later than the script's clock is a clock that stepped back: the window starts again
    at now (later in real time than the first comparison, so as safe)."""
    await ledger.upsert_node(inventory("cs4", S4000, n=1))
    key = ledger.keys.node("cs4")
    await redis_client.hset(key, "run", "0:0")  # another history's: unverified, as after a restart with data
    inv = inventory("cs4", S4000, n=1)
    first = await ledger.replace_node(inv, {}, KEEP_MS, verify_after_ms=KEEP_MS)  # the view's: starts the window
    assert not first["verified"] and 0 < first["verify_in_ms"] <= KEEP_MS
    token, at = str(await redis_client.hget(key, "unverified_since")).rsplit(":", 1)  # type: ignore[misc]
    await redis_client.hset(key, "unverified_since", f"{token}:{int(at) + STEP_MS * 12}")  # type: ignore[misc]
    again = await ledger.replace_node(inv, {}, KEEP_MS, verify_after_ms=KEEP_MS,
                                      truth_at=await ledger.redis_time_ms())
    assert not again["verified"] and again["verify_in_ms"] <= KEEP_MS, f"fenced for the step's hour: {again}"
    token, at = str(await redis_client.hget(key, "unverified_since")).rsplit(":", 1)  # type: ignore[misc]
    await redis_client.hset(key, "unverified_since", f"{token}:{int(at) - KEEP_MS}")  # type: ignore[misc]
    done = await ledger.replace_node(inv, {}, KEEP_MS, verify_after_ms=KEEP_MS, truth_at=await ledger.redis_time_ms())
    assert done["verified"], done
    assert (await ledger.reserve("cs4", "p9", [0], 8, 2, 1, pod="ns/p9"))[0].ok
