"""Red team: what the janitor's reads of pods from the API server (PodWatcher.api_holds) cost when it does not answer.

Before it expires a pending booking past pendingTTLSeconds, the janitor reads its pod from the API server and keeps
the booking when the read fails (fail closed), each read waiting up to API_HOLDS_READ_S (5 s). Two costs followed:

* The reads were made while the pod view was blind, although nothing is expired then whatever they say (`_blind`,
  judged after them): the very outage that blinds the view (an API server out of reach, overloaded) is one that does
  not answer, so each sweep waited out a read per booking, and logged a warning per booking, for nothing.
* The janitor sweeps node by node, and a node's reads are awaited before the next node is looked at: with one due
  booking on each of N nodes and an API server that does not answer, a sweep took N x API_HOLDS_READ_S (300 nodes:
  25 minutes, while no booking of any node was expired), and logged a warning per booking per sweep.

Expected: no read while the view is blind; once a read went unanswered, the rest of the sweep keeps its bookings
without waiting on the API server again (a sweep takes about one read's timeout, not one per node); one warning per
episode of unanswered reads, not one per booking per sweep.

Real parts: redis-server, Ledger, Mirror, PodWatcher, the role's janitor (`janitor_for`); the API server is the
test's (a GET that never answers).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

from controller import pod_watch
from controller.pod_watch import PodWatcher
from controller.watchers import janitor_for
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis.helpers import S4000, eventually, inventory
from tests.redis.test_redteam_janitor_blind import bound_pod, pending_past_ttl
from tests.redis.test_redteam_janitor_lagging_view import api, kept, live
from tests.redis.test_watcher_records import CFG

pytestmark = pytest.mark.redis

READ_S = 0.3  # API_HOLDS_READ_S here


def unanswering(w: PodWatcher) -> list[str]:
    """An API server that never answers a GET of a pod; returns the refs asked."""
    asked: list[str] = []

    async def get_pod(namespace: str, name: str) -> dict[str, Any]:
        asked.append(f"{namespace}/{name}")
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    w.kube.get_pod = get_pod  # type: ignore[method-assign]
    return asked


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.WARNING and "cannot ask the API server" in r.getMessage()]


async def test_redteam_the_janitor_reads_no_pod_while_the_pod_view_is_blind(
        watched: tuple[Ledger, Mirror, PodWatcher], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    led, mirror, w = watched
    monkeypatch.setattr(pod_watch, "API_HOLDS_READ_S", READ_S)
    w.reflector.synced.set()
    w.reflector._failing(OSError("Cannot connect to host apiserver:6443"))  # the API server out of reach
    asked = unanswering(w)
    janitor = await pending_past_ttl(led, mirror, w, "first")
    caplog.set_level(logging.INFO, "mtsched.watchers")
    t0 = time.monotonic()
    assert await janitor.sweep() == []
    took = time.monotonic() - t0
    assert asked == [] and not warnings(caplog), (
        f"the janitor read {asked} from the API server ({took:.2f}s, warnings {warnings(caplog)}) while its pod view "
        f"was blind, when nothing is expired whatever the reads say")


async def test_redteam_a_sweep_waits_on_an_unanswering_api_server_once_not_once_per_node(
        watched: tuple[Ledger, Mirror, PodWatcher], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    led, mirror, w = watched
    monkeypatch.setattr(pod_watch, "API_HOLDS_READ_S", READ_S)
    live(w)
    asked = unanswering(w)
    nodes = [f"m{i:02d}" for i in range(12)]
    for node in nodes:  # one booking on each node, its binder dead, its pod bound (the watch behind) or not
        await led.upsert_node(inventory(node, S4000, 1))
        out, _ = await led.reserve(node, f"u-{node}", [0], 8, 2, 1, pod=f"ns/p-{node}")
        assert out.ok
    await eventually(lambda: all(f"u-{n}" in (mirror.nodes[n].reservations if n in mirror.nodes else {})
                                 for n in nodes), what="the mirror shows the bookings")
    janitor = janitor_for(led, mirror, CFG, w)
    janitor.ttl = 1

    async def past_ttl() -> bool:
        now = await led.redis_time_ms()
        return all(now - mirror.nodes[n].reservations[f"u-{n}"].created > 1000 for n in nodes)

    await eventually(past_ttl, what="the bookings past their TTL")
    caplog.set_level(logging.INFO, "mtsched.watchers")
    took = []
    for _ in range(2):
        t0 = time.monotonic()
        assert await janitor.sweep() == []  # kept: the API server cannot say
        took.append(time.monotonic() - t0)
    for n in nodes:
        snap = await led.snapshot(n)
        assert snap is not None and snap.reservations[f"u-{n}"].state == "pending"
    assert max(took) < 3 * READ_S, (
        f"a sweep over {len(nodes)} nodes with one due booking each took {[round(t, 2) for t in took]}s with an API "
        f"server that does not answer ({len(asked)} reads, each waited out {READ_S}s node after node): at 300 nodes "
        f"and API_HOLDS_READ_S 5 s, 25 minutes in which no node's booking is expired")
    assert len(warnings(caplog)) <= 1, (
        f"{len(warnings(caplog))} warnings in 2 sweeps, one per booking per sweep: {warnings(caplog)[:3]}")


async def test_a_pod_the_view_holds_bound_there_without_a_record_it_can_book_is_kept_unread(
        watched: tuple[Ledger, Mirror, PodWatcher], caplog: pytest.LogCaptureFixture) -> None:
    """A pod bound on the node whose record is gone (or unreadable, with no mthreads.com/gpu-index to recover it
    from): the view never books it (its node is closed meanwhile) and the reconciler keeps the pending booking as
    it is (`Reconciler._confirm`: held). The janitor keeps it for the pod's life: it read the pod from the API server
    every sweep (every 5 s) and logged each time that `the pod view has not shown it yet`, which was false."""
    led, mirror, w = watched
    live(w)
    asked = api(w, {**bound_pod("first"), "metadata": {**bound_pod("first")["metadata"], "annotations": {}}})
    janitor = await pending_past_ttl(led, mirror, w, "first")
    pod = bound_pod("first")
    pod["metadata"]["annotations"] = {}  # no record: the watcher's view holds it bound on n4, unaccounted
    await w.on_event("MODIFIED", pod)
    assert w.quarantine("n4"), "the node is closed while the pod holds cards nobody can account for"
    caplog.set_level(logging.INFO, "mtsched.watchers")
    before = kept("view_bound")
    for _ in range(3):
        assert await janitor.sweep() == []
    assert kept("view_bound") == before + 3  # counted each sweep: a metric an operator can follow
    untrue = [r.getMessage() for r in caplog.records if "has not shown it yet" in r.getMessage()]
    assert not asked and not untrue, (
        f"the janitor read the pod {len(asked)} times in 3 sweeps although its live view holds it bound on n4, and "
        f"logged {len(untrue)} times that the view had not shown it: {untrue[:1]}")
