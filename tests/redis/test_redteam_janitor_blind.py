"""Red team: the janitor expires a running pod's booking while the watcher cannot see the pods.

A booking stays `pending` after its Binding when nobody confirmed it: the binder died right after the
Binding (docs/runbooks.md "A replica crashed mid-bind"), its `mark_bound` failed on a Redis blip
(`mtsched_bind_settle_failures_total`, "left to the watcher"), or the Binding's outcome was unknown (the POST
timed out on an overloaded API server and the pod could not be read: `Extender.bind` keeps the booking
pending). In each case only the pod watcher can save it, by seeing the pod's record and sending `observe`.

The janitor does not look at whether the watcher can see anything. While the pod stream is down or failing
(the same overloaded or unreachable API server that made the Binding's outcome unknown), `before_expire`
(`PodWatcher.confirm_now`) holds back nothing, because no record came, and `Janitor.sweep` expires the booking
once it is past pendingTTLSeconds. The card is free in the ledger under a running pod; the next bind books
it (below: a second exclusive pod on the same card) and when the stream comes back `observe` books the
first pod's record over it: two pods hold more of the card than it has. The reconciler, by contrast, judges
nothing while a stream is not live ("a stale view must not repair a correct ledger"); the janitor is the same
kind of repair with the same blind view. docs/architecture.md, step 5: "a binder that died never has its
running pod's share freed".

Expected: while the pod view is not live (`PodWatcher.reflector.problem(0)`), the janitor keeps pending
bookings (or asks the API server about the pod first, as `Reconciler._confirm` does, keeping it when it cannot
tell). Fix: controller/janitor.py `Janitor.sweep` / controller/watchers.py `janitor_for` (wire a view check,
like NodeWatcher's `view_problem`).

Real parts: redis-server, Ledger, Mirror, PodWatcher, the role's janitor (`janitor_for`).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from prometheus_client import REGISTRY

from controller import watchers
from controller.janitor import Janitor
from controller.pod_watch import PodWatcher
from controller.watchers import janitor_for
from shared.domain.annotations import ALLOCATED, PodUsage
from shared.kube import KubeError
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis.helpers import S4000, eventually, violations
from tests.redis.test_watcher_records import CFG

pytestmark = pytest.mark.redis

WHOLE = f"n4-mthreads-0,Mthreads,{S4000 * 512},16:;"  # card 0 of n4, whole (96 units, 16 cores)


def bound_pod(uid: str) -> dict:  # type: ignore[type-arg]
    limits = {"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": str(S4000), "mthreads.com/sgpu-core": "16"}
    return {"metadata": {"name": uid, "namespace": "ns", "uid": uid, "annotations": {ALLOCATED: WHOLE}},
            "spec": {"schedulerName": "hami-scheduler", "nodeName": "n4",
                     "containers": [{"name": "c", "resources": {"limits": limits}}]},
            "status": {"phase": "Running"}}


async def pending_past_ttl(led: Ledger, mirror: Mirror, w: PodWatcher, uid: str) -> Janitor:
    """Card 0 of n4 booked whole for `uid`, pending (never confirmed) and past a TTL of 1 s; the watcher role's
    janitor (janitor_for) with that TTL."""
    out, _ = await led.reserve("n4", uid, [0], S4000, 16, 1, model=S4000, whole=True, pod=f"ns/{uid}")
    assert out.ok
    await eventually(lambda: uid in (mirror.nodes["n4"].reservations if "n4" in mirror.nodes else {}),
                     what="the mirror shows the booking")
    janitor = janitor_for(led, mirror, CFG, w)
    janitor.ttl = 1

    async def past_ttl() -> bool:
        s = await led.snapshot("n4")
        return s is not None and await led.redis_time_ms() - s.reservations[uid].created > 1000

    await eventually(past_ttl, what="the booking past its TTL")
    return janitor


async def booked_again(led: Ledger, w: PodWatcher, caught_up: Callable[[], None] = lambda: None) -> tuple[bool, str]:
    """What follows an expiry of ns/first's booking on n4: the card is offered, another exclusive pod is booked on
    it, and the watcher (`caught_up`: its view back) books the running pod's record next to it. Returns whether the
    second pod was booked, and the card's violations then."""
    second, _ = await led.reserve("n4", "second", [0], S4000, 16, 1, model=S4000, whole=True, pod="ns/second")
    caught_up()
    await w.on_event("MODIFIED", bound_pod("first"))
    await led.observe("first", PodUsage("n4", (0,), S4000, 16, 1), "ns/first", keep_bound=True)
    snap = await led.snapshot("n4")
    assert snap is not None
    return second.ok, str(violations(snap))


async def test_redteam_the_janitor_keeps_pending_bookings_while_the_pod_view_is_blind(
        watched: tuple[Ledger, Mirror, PodWatcher]) -> None:
    led, mirror, w = watched
    # the pod stream was listed, then failed (the API server overloaded or out of reach from the watchers)
    w.reflector.synced.set()
    w.reflector._failing(OSError("Cannot connect to host apiserver:6443"))
    assert w.reflector.problem(0), "the pod view is not live"

    # bind of ns/first: booked (pending), Binding written (its answer lost), never confirmed
    janitor = await pending_past_ttl(led, mirror, w, "first")
    gone = await janitor.sweep()

    blind = w.reflector.problem(0) or "stream failing"
    second, broken = await booked_again(led, w, w.reflector._working)  # (what follows if it was expired)
    assert gone == [] and not second, (
        f"the janitor expired {gone} while the pod view was not live ({blind}); the card was booked again (second "
        f"pod booked: {second}) and now: {broken}")


def held() -> float:
    return REGISTRY.get_sample_value("mtsched_janitor_held") or 0.0


async def test_the_janitor_expires_again_once_the_pod_stream_has_worked_for_the_settle_time(
        watched: tuple[Ledger, Mirror, PodWatcher], monkeypatch: pytest.MonkeyPatch) -> None:
    """Not listed yet, failing, then back but still replaying: nothing expires and the gauge says so; once the
    stream has worked for the settle time, the booking nobody confirmed (its binder died, its pod gone) is
    expired, so the hold ends by itself."""
    led, mirror, w = watched
    # long while the replay is checked (a sweep of a few round trips on a busy machine must not outlast it), then
    # short, to see it end
    monkeypatch.setattr(watchers, "JANITOR_VIEW_SETTLE_SECONDS", 60.0)

    async def gone(namespace: str, name: str) -> dict:  # type: ignore[type-arg]
        raise KubeError(404, {"message": f"pods \"{name}\" not found"}, f"GET pod {namespace}/{name}")

    monkeypatch.setattr(w.kube, "get_pod", gone)  # the API server, asked before the expiry (api_holds)
    janitor = await pending_past_ttl(led, mirror, w, "orphan")
    w.reflector.synced.clear()
    assert await janitor.sweep() == [] and held() == 1.0, "expired before the pods were listed"
    w.reflector.synced.set()
    w.reflector._failing(OSError("connection reset"))
    assert await janitor.sweep() == [] and held() == 1.0, "expired while the stream failed"
    w.reflector._working()  # resumed: the events it missed may still be on their way
    assert w.reflector.unsettled(60.0)
    assert await janitor.sweep() == [] and held() == 1.0, "expired while the resumed stream replayed"
    monkeypatch.setattr(watchers, "JANITOR_VIEW_SETTLE_SECONDS", 0.5)
    await eventually(lambda: not w.reflector.unsettled(0.5), what="the stream settled")
    assert await janitor.sweep() == ["orphan"] and held() == 0.0
