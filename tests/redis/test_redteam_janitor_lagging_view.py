"""Red team: the janitor expires a running pod's booking while the pod watch is live but behind.

A booking stays `pending` after its Binding when nobody confirmed it (the binder died after the Binding was
committed, before `mark_bound`): only the pod watcher's sight of the pod's record books it. The janitor, before
expiring a pending booking past pendingTTLSeconds, asks the watcher (`before_expire`, `PodWatcher.confirm_now`) and
holds back while the view is blind (`view_problem`, `Reflector.unsettled`: not listed, failing, re-listing, an
unanswered watch request, back for less than 10 s). Nothing measures how far behind a *working* stream is: a watch
whose events arrive late (an API server whose watch cache trails etcd under load, a frozen replica whose silent
stream is taken for a quiet one until WATCH_READ_S, 120 s, the watcher's own backlog of events) is live by every
test the reflector makes. The Binding is committed within the first half of the TTL (`bind_deadline_s`), so a
watch behind by more than the rest of the TTL (2.5 s at pendingTTLSeconds 5, the least the config takes; 115 s at
the default 120 s, within WATCH_READ_S) lets the janitor expire the booking of a pod the API server holds bound
there. Until the watch catches up (and books the record again) the card is free in the ledger: the next bind books
it, and the watcher's observe then over-commits it. The reconciler asks the API server (`Reconciler._confirm`)
before it frees a booking no live holder explains, "so a lagging watch never frees a card a running pod holds"
(docs/architecture.md); the janitor did not.

Found by tests/redis/test_redteam_janitor_stress.py (late/early variant, seed 32 at 200 pods): a watcher ~2.5 s
behind at a scaled TTL of 2 s.

Expected: a booking the pod view does not vouch for is expired only once the API server says its pod is not bound
there (gone, another pod of that name, ended, or bound elsewhere or nowhere); bound there, or no answer, it is kept.

Real parts: redis-server, Ledger, Mirror, PodWatcher, the role's janitor (`janitor_for`); the API server's answer
to the pod's GET is the test's.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from prometheus_client import REGISTRY

from controller.pod_watch import PodWatcher
from shared.kube import KubeError
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis.test_redteam_janitor_blind import booked_again, bound_pod, pending_past_ttl

pytestmark = pytest.mark.redis


def live(w: PodWatcher) -> None:
    """The pod stream listed and working for a minute: the janitor's view check (`unsettled`) has nothing to say."""
    w.reflector.synced.set()
    w.reflector._working()
    w.reflector.live_since = time.monotonic() - 60
    assert not w.reflector.unsettled(10.0)


def api(w: PodWatcher, answer: Any) -> list[str]:
    """The API server's answer to a GET of a pod: a pod (dict) or an exception; returns the refs asked."""
    asked: list[str] = []

    async def get_pod(namespace: str, name: str) -> dict[str, Any]:
        asked.append(f"{namespace}/{name}")
        if isinstance(answer, BaseException):
            raise answer
        return dict(answer)

    w.kube.get_pod = get_pod  # type: ignore[method-assign]
    return asked


def kept(why: str) -> float:
    return REGISTRY.get_sample_value("mtsched_janitor_kept_total", {"why": why}) or 0.0


async def test_redteam_the_janitor_keeps_a_committed_bindings_booking_while_the_live_pod_watch_lags(
        watched: tuple[Ledger, Mirror, PodWatcher]) -> None:
    led, mirror, w = watched
    live(w)
    # bind of ns/first: booked (pending), Binding committed, the binder dead before mark_bound; the API server
    # holds the pod bound on n4 with its record, and the watch has not delivered that yet
    asked = api(w, bound_pod("first"))
    janitor = await pending_past_ttl(led, mirror, w, "first")
    assert janitor.view_problem() == ""
    before = kept("api_bound")
    gone = await janitor.sweep()
    assert kept("api_bound") == before + 1  # counted: the API server's pod holds it

    second, broken = await booked_again(led, w)  # (what follows if it was expired: the watch caught up)
    assert gone == [] and not second, (
        f"the janitor expired {gone} (the API server asked about: {asked}) while the API server held the pod bound "
        f"there and the live pod watch had not shown it yet; the card was booked again (second pod booked: "
        f"{second}) and now: {broken}")
    assert asked == ["ns/first"]


@pytest.mark.parametrize("answer", [
    KubeError(404, {"message": "pods \"first\" not found"}, "GET pod ns/first"),
    {**bound_pod("first"), "metadata": {**bound_pod("first")["metadata"], "uid": "another"}},
    {**bound_pod("first"), "spec": {**bound_pod("first")["spec"], "nodeName": ""}},
    {**bound_pod("first"), "spec": {**bound_pod("first")["spec"], "nodeName": "n5"}},
    {**bound_pod("first"), "status": {"phase": "Succeeded"}},
], ids=["gone", "recreated", "not_bound", "bound_elsewhere", "ended"])
async def test_the_janitor_expires_a_booking_once_the_api_server_says_its_pod_does_not_hold_it(
        watched: tuple[Ledger, Mirror, PodWatcher], answer: Any) -> None:
    led, mirror, w = watched
    live(w)
    asked = api(w, answer)
    janitor = await pending_past_ttl(led, mirror, w, "first")
    assert await janitor.sweep() == ["first"]
    assert asked == ["ns/first"]


@pytest.mark.parametrize("answer", [
    KubeError(503, {"message": "etcdserver: request timed out"}, "GET pod ns/first"),
    KubeError(403, {"message": "forbidden"}, "GET pod ns/first"),
    TimeoutError("GET pod ns/first"),
], ids=["unavailable", "forbidden", "timeout"])
async def test_the_janitor_keeps_a_booking_the_api_server_cannot_be_asked_about(
        watched: tuple[Ledger, Mirror, PodWatcher], answer: Any) -> None:
    led, mirror, w = watched
    live(w)
    api(w, answer)
    janitor = await pending_past_ttl(led, mirror, w, "first")
    before = kept("api_unanswered")
    assert await janitor.sweep() == []
    assert kept("api_unanswered") == before + 1
    snap = await led.snapshot("n4")
    assert snap is not None and snap.reservations["first"].state == "pending"
