"""Every Binding is committed within its deadline or never (shared/domain/timing.py), so the watchers' keep
window is a bound: a bind in flight when Redis lost its booking is in the API before a read that verifies its
node. The extender sends the Binding only with enough of the deadline left, asks the API server to abandon it
at the deadline, and, when a Binding's outcome is unknown and the pod reads unbound, reads it again only after
that deadline before it gives the cards back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import pytest

from controller.extender import Extender
from shared.domain.timing import BIND_DEADLINE_S, BIND_MIN_LEFT_S, BIND_SETTLE_S, bind_deadline_s
from shared.kube import KubeError
from shared.serving.metrics import RELEASES
from shared.store.ledger import Ledger
from tests.redis import test_extender_bind
from tests.redis.test_extender_bind import FakeKube, pod

pytestmark = pytest.mark.redis

setup = test_extender_bind.setup  # the fixture: an extender on a real Redis with two nodes

SLICE = {"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 32, "mthreads.com/sgpu-core": 8}
ARGS = {"PodName": "p-u", "PodNamespace": "ns", "PodUID": "u", "Node": "s5k"}


def test_the_deadline_fits_in_the_keep_window_and_the_pending_ttl() -> None:
    assert bind_deadline_s(120) == BIND_DEADLINE_S
    assert bind_deadline_s(5) == 2.5  # the smallest pendingTTLSeconds: the janitor never beats a Binding
    assert bind_deadline_s(5) > BIND_MIN_LEFT_S


async def test_every_binding_carries_the_deadline_of_its_reservation(setup: tuple[Extender, FakeKube, Ledger]) -> None:
    ext, kube, _ = setup
    ext.filter({"Pod": pod("u", SLICE), "NodeNames": ["s5k"], "Nodes": None})
    before = time.monotonic()
    assert (await ext.bind(ARGS))["Error"] == ""
    after = time.monotonic()
    (until,) = kube.deadlines  # the deadline counts from the start of the reservation, within this call
    assert until is not None and before + ext.bind_deadline <= until <= after + ext.bind_deadline


async def test_a_binding_too_late_to_meet_the_deadline_is_not_sent(setup: tuple[Extender, FakeKube, Ledger]) -> None:
    ext, kube, ledger = setup
    ext.bind_deadline = BIND_MIN_LEFT_S / 2  # as if the reservation had taken the whole deadline
    ext.filter({"Pod": pod("u", SLICE), "NodeNames": ["s5k"], "Nodes": None})
    counted = RELEASES.labels("bind_failed")._value.get()
    out = await ext.bind(ARGS)
    assert "not sent" in out["Error"] and "reservation released" in out["Error"], out
    assert RELEASES.labels("bind_failed")._value.get() == counted + 1
    assert not kube.deadlines and not kube.bound
    snap = await ledger.snapshot("s5k")
    assert snap is not None and not snap.reservations


@pytest.mark.parametrize("named", [False, True], ids=["earlier-lists-none", "earlier-named"])
async def test_too_late_for_a_booking_an_earlier_attempt_made_keeps_it(
        setup: tuple[Extender, FakeKube, Ledger], named: bool) -> None:
    """The earlier attempt's Binding may still be in flight: its booking is not given away. This attempt takes only
    its own name off, so once an earlier attempt listed by name gives the booking back too, nothing holds it (not
    left on it until the janitor's expiry); one that lists none (no hold) keeps it."""
    ext, _, ledger = setup
    earlier, _ = await ledger.reserve("s5k", "u", [0], 32, 8, 1, pod="ns/p-u", hold_ms=5000 if named else 0)
    assert earlier.ok
    ext.bind_deadline = BIND_MIN_LEFT_S / 2
    ext.filter({"Pod": pod("u", SLICE), "NodeNames": ["s5k"], "Nodes": None})
    out = await ext.bind(ARGS)
    assert "not sent" in out["Error"] and "kept" in out["Error"], out
    snap = await ledger.snapshot("s5k")
    assert snap is not None and snap.reservations["u"].state == "pending"
    if named:
        assert (await ledger.give_back("s5k", "u", earlier.bind_no, attempt=earlier.attempt))[0] == "released"


class LateKube(FakeKube):
    """The API server times the Binding out, then commits it anyway a little later (before its deadline)."""

    def __init__(self, commit_after: float | None) -> None:
        super().__init__()
        self.commit_after = commit_after
        self.reads: list[float] = []  # when the pod was read

    async def bind(self, ns: str, name: str, uid: str, node: str, annotations: Mapping[str, str],
                   until: float | None = None) -> None:
        self.deadlines.append(until)
        if self.commit_after is not None:
            async def commit() -> None:
                await asyncio.sleep(self.commit_after or 0)
                p = self.pods[(ns, name)]
                p["spec"]["nodeName"] = node
                p["metadata"]["annotations"].update(annotations)
                self.bound.append((f"{ns}/{name}", uid, node, dict(annotations)))
            asyncio.get_running_loop().create_task(commit())
        raise KubeError(504, {"message": "Timeout: request did not complete within the requested timeout"}, "bind")

    async def get_pod(self, ns: str, name: str) -> dict[str, Any]:
        self.reads.append(time.monotonic())
        return await super().get_pod(ns, name)


@pytest.mark.parametrize("commits", [True, False], ids=["committed after the timeout", "never committed"])
async def test_an_unknown_outcome_is_read_again_after_the_deadline(setup: tuple[Extender, FakeKube, Ledger],
                                                                   commits: bool) -> None:
    ext, _, ledger = setup
    kube = LateKube(0.2 if commits else None)
    ext.kube = kube  # type: ignore[assignment]
    ext.bind_deadline = 0.6
    kube.pods[("ns", "p-u")] = pod("u", SLICE)
    ext.filter({"Pod": pod("u", SLICE), "NodeNames": ["s5k"], "Nodes": None})
    out = await ext.bind(ARGS)
    (until,) = kube.deadlines
    assert until is not None
    first, again = kube.reads  # at once (unbound), and again once the deadline and a margin had passed
    assert first < until and again >= until + BIND_SETTLE_S
    await ext.settled()
    snap = await ledger.snapshot("s5k")
    assert snap is not None
    if commits:  # the pod holds the card with its record: the booking is kept and marked bound
        assert out["Error"] == "" and snap.reservations["u"].state == "bound", out
    else:  # the read after the deadline says never: the cards are given back
        assert "reservation released" in out["Error"] and not snap.reservations, out
