"""A sweep's overlapping reads against bind attempts that take bookings over and commit their Bindings while the
reads wait (random, seeded): whatever the order, no booking is expired once the API server holds its pod bound on
that node (the test's API server records when each Binding is committed; each expire.lua call is checked against
it). The red team's case alone: tests/redis/test_redteam_janitor_overlap.py."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable
from typing import Any

import pytest

from controller.pod_watch import PodWatcher
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis.helpers import eventually
from tests.redis.test_janitor_concurrent_reads import due_bookings
from tests.redis.test_redteam_janitor_lagging_view import live

pytestmark = pytest.mark.redis


@pytest.mark.parametrize("seed", range(4))
async def test_no_booking_is_expired_once_its_pod_is_bound_there(
        watched: tuple[Ledger, Mirror, PodWatcher], seed: int) -> None:
    rng = random.Random(seed)
    led, mirror, w = watched
    live(w)
    nodes = {f"f{i}": 2 for i in range(6)}
    janitor, uids = await due_bookings(led, mirror, w, nodes)
    bound: dict[str, str] = {}  # pod name -> node its Binding was committed on
    where = {f"p-{u.removeprefix('u-')}": u.split("-")[1] for u in uids}
    takeovers = set(rng.sample(sorted(where), 5))
    violations: list[str] = []

    async def take_over(pod: str) -> None:
        node, uid = where[pod], "u-" + pod.removeprefix("p-")
        card = int(pod.rsplit("-", 1)[1])
        out, _ = await led.reserve(node, uid, [card], 8, 2, 1, pod=f"ns/{pod}", hold_ms=100)
        if not out.ok:
            return  # expired already: nothing to take over
        bound[pod] = node
        snap = await led.snapshot(node)
        if snap is None or uid not in snap.reservations:
            return
        settle_by = snap.reservations[uid].settle_by

        async def over() -> bool:
            return await led.redis_time_ms() > settle_by

        await eventually(over, what="the attempt's settle_by passed")

    async def get_pod(namespace: str, name: str) -> dict[str, Any]:
        for _ in range(rng.randrange(20)):
            await asyncio.sleep(0)
        if name in takeovers and rng.random() < 0.5:
            takeovers.discard(name)
            answer = {"metadata": {"uid": "u-" + name.removeprefix("p-"), "namespace": namespace, "name": name},
                      "spec": {}, "status": {"phase": "Pending"}}  # read before the take-over's Binding
            await take_over(name)
            return answer
        other = sorted(takeovers)  # another pod's take-over while this read is in flight
        if other and rng.random() < 0.3:
            victim = rng.choice(other)
            takeovers.discard(victim)
            await take_over(victim)
        spec = {"nodeName": bound[name]} if name in bound else {}
        return {"metadata": {"uid": "u-" + name.removeprefix("p-"), "namespace": namespace, "name": name},
                "spec": spec, "status": {"phase": "Running" if spec else "Pending"}}

    w.kube.get_pod = get_pod  # type: ignore[method-assign]
    expire = led.expire

    async def checked(node: str, ttl_seconds: float, only: Iterable[str] | None = None) -> list[str]:
        at_call = dict(bound)
        gone = await expire(node, ttl_seconds, only=only)
        for uid in gone:
            pod = "p-" + uid.removeprefix("u-")
            if at_call.get(pod) == node:
                violations.append(f"{uid} on {node}: expired after its pod's Binding there")
        return gone

    led.expire = checked  # type: ignore[method-assign]
    await janitor.sweep()
    assert not violations, violations
