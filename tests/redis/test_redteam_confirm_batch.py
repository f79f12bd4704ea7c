"""Red team on the batched confirmation (controller/confirm.py Confirmations.settle/_confirm, Ledger.mark_bound_many,
mark_bound.lua `uids`, one `bound` feed message per batch with the others in `more`, Mirror.apply reading `more`).

Findings proved here (each test fails on the change as reviewed):

1. A stop that outwaits a batch counts one settle failure per batch, not per booking:
   `Extender.settled` adds len(self._settling), the number of tasks, to mtsched_bind_settle_failures_total
   ("Answered binds whose booking was not marked bound ... or the role stopped first") and logs it as
   "N booking(s)"; a `_confirm` task now carries every bind answered on its node within CONFIRM_LINGER.

2. A replica of the previous release (rolling upgrade: `helm upgrade` rolls one replica at a time, so old
   and new roles share the feed) applies a batched `bound` message without reading `more`: its snapshot
   takes the ledger's (version, stamp) while every reservation but the first stays `pending`. A periodic
   resync compares only (version, stamp) (Ledger.heads), so it does not re-read the node; the state is
   wrong until a FULL_EVERY resync (up to 5 minutes). Meanwhile that replica's pod watcher finds the
   bookings pending, waits BOUND_GRACE and sends `observe` for each of them (the round trips the
   confirmation exists to save), and its janitor keeps offering them to `expire` once past the TTL.

Each test of 2 runs twice: with the release's own Mirror ("current", the control, passes) and with the
previous release's ("previous", fails).

Real parts: redis-server, Ledger, Mirror, Extender, PodWatcher; the API server is the recording stand-in of
test_extender_bind. The "previous release" mirror is Mirror with `more` and `span` dropped from every message,
which is what its apply did (it never read the fields).

Fixed by counting a batch as one version per reservation it changed (`span`): a mirror that reads only
`uid`/`res` sees a gap and re-reads the node.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from controller import confirm
from controller.extender import Extender
from controller.pod_watch import PodWatcher
from shared.kube import Kube
from shared.serving.metrics import SETTLE_FAILURES
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis.conftest import WATCHER_CFG
from tests.redis.helpers import eventually
from tests.redis.test_extender_bind import FakeKube, pod
from tests.redis.test_extender_bind import setup as setup  # the fixture, reused
from tests.redis.test_watcher_records import pod as bound_pod
from tests.redis.test_watcher_records import records

pytestmark = pytest.mark.redis

SLICE = {"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 8, "mthreads.com/sgpu-core": 2}


# -- 1. the stop's count -------------------------------------------------------------------------------------

async def test_a_stop_that_outwaits_a_batch_counts_each_booking_left_unconfirmed(
        setup: tuple[Extender, FakeKube, Ledger], monkeypatch: pytest.MonkeyPatch) -> None:
    ext, kube, ledger = setup
    uids = ["st1", "st2", "st3"]
    for uid in uids:
        ext.filter({"Pod": pod(uid, SLICE), "NodeNames": ["s5k"], "Nodes": None})
    entered, go = asyncio.Event(), asyncio.Event()
    calls: list[list[str]] = []
    real = ledger.mark_bound_many

    async def hanging(node_name: str, batch: Any) -> list[str]:  # Redis slow at the stop
        calls.append(list(batch))
        entered.set()
        await go.wait()
        return await real(node_name, batch)

    monkeypatch.setattr(ledger, "mark_bound_many", hanging)
    monkeypatch.setattr(confirm, "CONFIRM_LINGER", 0.5)  # the three binds surely in one batch, on a busy machine too
    answers = await asyncio.gather(*(ext.bind({"PodName": f"p-{u}", "PodNamespace": "ns", "PodUID": u,
                                               "Node": "s5k"}) for u in uids))
    assert answers == [{"Error": ""}] * 3 and len(kube.bound) == 3
    await asyncio.wait_for(entered.wait(), 5)
    assert [sorted(c) for c in calls] == [uids]  # the three answered binds are one batch, its call hangs
    before = SETTLE_FAILURES._value.get()
    await ext.settled(timeout=0.2)  # the role stops: three answered binds' bookings are left pending
    counted = SETTLE_FAILURES._value.get() - before
    go.set()  # (let the batch finish, for the fixture's own settled())
    assert counted == 3, f"the stop left 3 bookings unconfirmed and counted {counted:g}"


# -- 2. a replica of the previous release -----------------------------------------------------------------------

class PreviousMirror(Mirror):
    """The mirror of the release before the change: its apply never read `more` nor `span` (it takes a message
    whose version is one more than its own, else re-reads the node)."""

    def apply(self, msg: Mapping[str, Any]) -> str | None:
        return super().apply({k: v for k, v in msg.items() if k not in ("more", "span")})


# "current" is the control (passes: the release's own mirror reads `more`); "previous" fails
@pytest.fixture(params=[Mirror, PreviousMirror], ids=["current", "previous"])
async def previous(cluster: Ledger, request: pytest.FixtureRequest) -> AsyncIterator[tuple[Ledger, Mirror]]:
    m = request.param(cluster, resync_seconds=300.0)
    await m.start()
    await asyncio.wait_for(m.ready.wait(), 5)
    yield cluster, m
    await m.stop()


async def _batch_confirmed(led: Ledger, m: Mirror, uids: list[str]) -> None:
    """Three bookings on n4 card 0 (as bind leaves them: pending), then confirmed as _confirm does, in one call;
    returns once the mirror holds the ledger's last write of n4."""
    for uid in uids:
        assert (await led.reserve("n4", uid, [0], 2, 1, 1, pod=f"ns/{uid}"))[0].ok
    assert await led.mark_bound_many("n4", uids) == []
    snap = await led.snapshot("n4")
    assert snap is not None
    await eventually(lambda: (s := m.get("n4")) is not None and (s.version, s.stamp) == (snap.version, snap.stamp),
                     what="the mirror applied the batch's message")


async def test_a_replica_of_the_previous_release_is_not_left_with_confirmed_bookings_pending(
        previous: tuple[Ledger, Mirror]) -> None:
    led, m = previous
    uids = ["ru1", "ru2", "ru3"]
    await _batch_confirmed(led, m, uids)
    await m.resync()  # the periodic safety net (not the FULL_EVERY-th): compares (version, stamp) only
    snap = await led.snapshot("n4")
    assert snap is not None and {snap.reservations[u].state for u in uids} == {"bound"}
    held = {u: r.state for u, r in m.get("n4").reservations.items()}  # type: ignore[union-attr]
    assert held == dict.fromkeys(uids, "bound"), (
        f"a previous-release mirror holds the ledger's (version, stamp) of n4 with {held}: the batch's `more` "
        f"was dropped and its periodic resync does not re-read the node")


async def test_a_previous_release_watcher_is_not_made_to_observe_every_batched_pod(
        previous: tuple[Ledger, Mirror]) -> None:
    led, m = previous
    uids = ["rw1", "rw2", "rw3"]
    w = PodWatcher(Kube(None), Ledger(led.redis), m, WATCHER_CFG, asyncio.Event())  # type: ignore[arg-type]
    await _batch_confirmed(led, m, uids)
    before = records("observed")
    for uid in uids:  # the pods' records, as the watch brings them once the Bindings exist
        p = bound_pod(uid)
        await w.record(uid, p, w.learn(uid, p))
    sent = await w.confirm_due(now=float("inf"))  # their grace over
    observed = records("observed") - before
    assert sent == 0 and observed == 0, (
        f"the bind confirmed all three in one call, yet a previous-release watcher sent observe for {sent} "
        f"of them (mtsched_records_total{{observed}} +{observed:g})")

