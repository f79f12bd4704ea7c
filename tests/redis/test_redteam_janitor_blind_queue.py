"""Red team: the janitor's reads waiting for their turn are made although the pod view went blind meanwhile.

A sweep's reads of pods take API_HOLDS_READS turns at a time over every node (PodWatcher.api_reads). The view is
checked as each node's reads are asked for (Janitor._vet_and_expire) and again before each node's expiry, but a read
waiting for its turn was made whenever its turn came: with more due bookings than turns, the view going blind while
the first reads were in flight (the stream failing, or re-listing) did not stop the rest, although nothing is expired
while it is blind whatever they say ("nothing is read or expired while the pod view is blind").

Expected: a read whose turn comes while the view is blind is not made (its booking is kept, for a later sweep).

Real parts: redis-server, Ledger, Mirror, PodWatcher, the role's janitor; the API server is the test's.
"""

from __future__ import annotations

import asyncio
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


async def test_redteam_no_read_waiting_for_its_turn_is_made_once_the_view_is_blind(
        watched: tuple[Ledger, Mirror, PodWatcher]) -> None:
    led, mirror, w = watched
    live(w)
    nodes = {f"v{i:02d}": 1 for i in range(API_HOLDS_READS + 4)}
    janitor, uids = await due_bookings(led, mirror, w, nodes)
    answer = asyncio.Event()
    in_flight: list[str] = []
    blind_reads: list[str] = []

    async def get_pod(namespace: str, name: str) -> dict[str, Any]:
        if janitor.view_problem():
            blind_reads.append(f"{namespace}/{name}")
        in_flight.append(name)
        await answer.wait()
        raise KubeError(404, {"message": f"pods \"{name}\" not found"}, f"GET pod {namespace}/{name}")

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
