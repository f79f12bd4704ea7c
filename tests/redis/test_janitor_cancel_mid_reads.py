"""The supervisor restarting the janitor (its task cancelled) mid-sweep leaves no read's turn taken and no node's
vetting un-awaited: cancelled while its reads are in flight and others wait for their turn, or while it is still
looking at the nodes (their vetting not begun), the pod watcher's API_HOLDS_READS turns are all free again, and no
coroutine is left never awaited. Nothing is expired by the cancelled sweep; the next one expires what is due."""

from __future__ import annotations

import asyncio
import gc
import warnings
from typing import Any

import pytest

from controller.pod_watch import PodWatcher
from shared.domain.timing import API_HOLDS_READS
from shared.kube import KubeError
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis.helpers import eventually
from tests.redis.test_janitor_concurrent_reads import due_bookings
from tests.redis.test_redteam_janitor_lagging_view import live

pytestmark = pytest.mark.redis


async def test_cancelled_mid_reads_and_mid_look_the_turns_are_all_free(
        watched: tuple[Ledger, Mirror, PodWatcher]) -> None:
    led, mirror, w = watched
    live(w)
    nodes = {f"k{i:02d}": 1 for i in range(API_HOLDS_READS + 4)}
    janitor, uids = await due_bookings(led, mirror, w, nodes)
    in_flight: list[str] = []
    answer = asyncio.Event()

    async def get_pod(namespace: str, name: str) -> dict[str, Any]:
        in_flight.append(name)
        await answer.wait()
        raise KubeError(404, {"message": f"pods \"{name}\" not found"}, f"GET pod {namespace}/{name}")

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
