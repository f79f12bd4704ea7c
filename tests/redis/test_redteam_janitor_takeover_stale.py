"""Red team: a booking a later bind attempt took over, expired on a judgement made before the take-over.

The janitor looks at a node (its fresh snapshot: a later attempt's settle_by dates the booking anew), reads each due
booking's pod from the API server, and sends the node's expire.lua once every one of the node's reads is answered.
Those reads share API_HOLDS_READS turns with every other node of the sweep, so one booking's answer ("its pod is not
bound") may come long before the node's expiry is sent. If meanwhile a later bind attempt of that pod took the
booking over (reserve's `existing`: a new settle_by, no feed message) and its Binding was committed, expire.lua sees
the booking pending past its TTL with no attempt in flight (settle_by passed) and frees the cards of a bound pod.

Expected: a booking whose stamps changed since it was judged is not expired on that judgement (a later sweep judges
it anew: the pod view or the API server then holds it bound).

Real parts: redis-server, Ledger, Mirror, PodWatcher, the role's janitor; the API server is the test's.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from controller.pod_watch import PodWatcher
from shared.kube import KubeError
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis.helpers import eventually
from tests.redis.test_janitor_concurrent_reads import due_bookings
from tests.redis.test_redteam_janitor_lagging_view import live

pytestmark = pytest.mark.redis


async def test_redteam_a_booking_taken_over_after_its_read_is_not_expired_on_that_read(
        watched: tuple[Ledger, Mirror, PodWatcher]) -> None:
    led, mirror, w = watched
    live(w)
    janitor, _ = await due_bookings(led, mirror, w, {"t1": 2})  # u-t1-0 (card 0), u-t1-1 (card 1)
    first_answered, second_may_answer = asyncio.Event(), asyncio.Event()
    bound = {"p-t1-0": False}

    async def get_pod(namespace: str, name: str) -> dict[str, Any]:
        if name == "p-t1-0":
            spec = {"nodeName": "t1"} if bound[name] else {}
            first_answered.set()
            return {"metadata": {"uid": "u-t1-0", "namespace": namespace, "name": name}, "spec": spec,
                    "status": {"phase": "Pending"}}
        await second_may_answer.wait()  # its turn came late (other nodes' reads): the node's expiry waits on it
        raise KubeError(404, {"message": f"pods \"{name}\" not found"}, f"GET pod {namespace}/{name}")

    w.kube.get_pod = get_pod  # type: ignore[method-assign]
    sweep = asyncio.create_task(janitor.sweep())
    await first_answered.wait()  # u-t1-0 judged: its pod is not bound
    # kube-scheduler's later attempt on the same node takes the booking over, and its Binding is committed
    out, _ = await led.reserve("t1", "u-t1-0", [0], 8, 2, 1, pod="ns/p-t1-0", hold_ms=200)
    assert out.ok and out.existing
    bound["p-t1-0"] = True
    snap = await led.snapshot("t1")
    assert snap is not None
    settle_by = snap.reservations["u-t1-0"].settle_by

    async def attempt_over() -> bool:
        return await led.redis_time_ms() > settle_by

    await eventually(attempt_over, what="the later attempt's settle_by passed")
    second_may_answer.set()
    gone = await sweep
    snap = await led.snapshot("t1")
    assert snap is not None
    assert "u-t1-0" in snap.reservations, (
        f"the janitor expired {gone}: u-t1-0's booking, taken over by a later bind attempt whose Binding was "
        f"committed after the read that judged it, freed a bound pod's card")
    assert "u-t1-1" not in snap.reservations and "u-t1-1" in gone
