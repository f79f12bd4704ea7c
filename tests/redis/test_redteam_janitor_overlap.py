"""Red team of the janitor's reads of pods overlapping across nodes (API_HOLDS_READS turns over a whole sweep:
PodWatcher.api_reads; Janitor._vet_and_expire). Real parts: redis-server, Ledger, Mirror, PodWatcher, the role's
janitor; the API server is the test's.

1. The supervisor restarting the janitor (its task cancelled) mid-sweep leaves no read's turn taken and no node's
   vetting un-awaited: cancelled while its reads are in flight and others wait for their turn, or while it is still
   looking at the nodes (their vetting not begun), the turns are all free again, and no coroutine is left never
   awaited. Nothing is expired by the cancelled sweep; the next one expires what is due.
2. A read waiting for its turn was made whenever its turn came: with more due bookings than turns, the view going
   blind while the first reads were in flight (the stream failing, or re-listing) did not stop the rest, although
   nothing is expired while it is blind whatever they say. A read whose turn comes while the view is blind is not
   made (its booking is kept, for a later sweep).
3. One booking's answer ("its pod is not bound") may come long before its node's expiry is sent (the node's other
   reads wait their turns). If meanwhile a later bind attempt of that pod took the booking over (reserve's
   `existing`: a new settle_by, no feed message) and its Binding was committed, expire.lua saw the booking pending
   past its TTL with no attempt in flight (settle_by passed) and freed the cards of a bound pod. A booking whose
   stamps changed since it was judged is not expired on that judgement (a later sweep judges it anew).
"""

from __future__ import annotations

import asyncio
import gc
import warnings
from typing import Any

import pytest

from controller.janitor import Janitor
from controller.pod_watch import PodWatcher
from shared.domain.timing import API_HOLDS_READS
from shared.kube import KubeError
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis.helpers import eventually
from tests.redis.test_janitor_concurrent_reads import due_bookings
from tests.redis.test_redteam_janitor_lagging_view import live

pytestmark = pytest.mark.redis


async def overlapping(watched: tuple[Ledger, Mirror, PodWatcher], nodes: dict[str, int]
                      ) -> tuple[Ledger, PodWatcher, Janitor, list[str]]:
    """The pod view live, and on each of `nodes` that many bookings due for the janitor."""
    led, mirror, w = watched
    live(w)
    janitor, uids = await due_bookings(led, mirror, w, nodes)
    return led, w, janitor, uids


def not_found(namespace: str, name: str) -> KubeError:
    return KubeError(404, {"message": f"pods \"{name}\" not found"}, f"GET pod {namespace}/{name}")


async def test_cancelled_mid_reads_and_mid_look_the_turns_are_all_free(
        watched: tuple[Ledger, Mirror, PodWatcher]) -> None:
    nodes = {f"k{i:02d}": 1 for i in range(API_HOLDS_READS + 4)}
    led, w, janitor, uids = await overlapping(watched, nodes)
    in_flight: list[str] = []
    answer = asyncio.Event()

    async def get_pod(namespace: str, name: str) -> dict[str, Any]:
        in_flight.append(name)
        await answer.wait()
        raise not_found(namespace, name)

    w.kube.get_pod = get_pod  # type: ignore[method-assign]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # 1. mid reads: 8 in flight, 4 waiting for their turn
        sweep = asyncio.create_task(janitor.sweep())
        await eventually(lambda: len(in_flight) == API_HOLDS_READS, what="the first turns' reads in flight")
        sweep.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sweep
        assert w.api_reads._value == API_HOLDS_READS and not w.api_reads._waiters, "a read's turn leaked"
        # 2. mid look: cancelled in the 3rd node's confirmation, two nodes' vetting made and not begun
        confirm = janitor.before_expire
        assert confirm is not None
        looked: list[list[str]] = []
        stuck = asyncio.Event()

        async def before_expire(u: list[str]) -> Any:
            looked.append(u)
            if len(looked) == 3:
                stuck.set()
                await asyncio.Event().wait()
            return await confirm(u)

        janitor.before_expire = before_expire
        sweep = asyncio.create_task(janitor.sweep())
        await stuck.wait()
        sweep.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sweep
        janitor.before_expire = confirm
        gc.collect()
    never = [str(c.message) for c in caught if "never awaited" in str(c.message)]
    assert not never, never
    assert w.api_reads._value == API_HOLDS_READS
    for n in nodes:
        snap = await led.snapshot(n)
        assert snap is not None and len(snap.reservations) == 1, f"{n}: expired by a cancelled sweep"
    answer.set()
    assert sorted(await janitor.sweep()) == sorted(uids)


async def test_redteam_no_read_waiting_for_its_turn_is_made_once_the_view_is_blind(
        watched: tuple[Ledger, Mirror, PodWatcher]) -> None:
    _, w, janitor, uids = await overlapping(watched, {f"v{i:02d}": 1 for i in range(API_HOLDS_READS + 4)})
    answer = asyncio.Event()
    in_flight: list[str] = []
    blind_reads: list[str] = []

    async def get_pod(namespace: str, name: str) -> dict[str, Any]:
        if janitor.view_problem():
            blind_reads.append(f"{namespace}/{name}")
        in_flight.append(name)
        await answer.wait()
        raise not_found(namespace, name)

    w.kube.get_pod = get_pod  # type: ignore[method-assign]
    sweep = asyncio.create_task(janitor.sweep())
    await eventually(lambda: len(in_flight) == API_HOLDS_READS, what="the first turns' reads in flight")
    w.reflector._failing(OSError("Cannot connect to host apiserver:6443"))  # the view goes blind
    answer.set()
    gone = await sweep
    assert gone == []
    assert not blind_reads, f"{len(blind_reads)} pods read while the pod view was blind: {blind_reads}"
    live(w)
    assert sorted(await janitor.sweep()) == sorted(uids)


async def test_redteam_a_booking_taken_over_after_its_read_is_not_expired_on_that_read(
        watched: tuple[Ledger, Mirror, PodWatcher]) -> None:
    led, w, janitor, _ = await overlapping(watched, {"t1": 2})  # u-t1-0 (card 0), u-t1-1 (card 1)
    first_answered, second_may_answer = asyncio.Event(), asyncio.Event()
    bound = {"p-t1-0": False}

    async def get_pod(namespace: str, name: str) -> dict[str, Any]:
        if name == "p-t1-0":
            spec = {"nodeName": "t1"} if bound[name] else {}
            first_answered.set()
            return {"metadata": {"uid": "u-t1-0", "namespace": namespace, "name": name}, "spec": spec,
                    "status": {"phase": "Pending"}}
        await second_may_answer.wait()  # its turn came late (other nodes' reads): the node's expiry waits on it
        raise not_found(namespace, name)

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
