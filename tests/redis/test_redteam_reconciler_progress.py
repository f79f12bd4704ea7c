"""Red team of f532973 (Supervisor.progress): the reconciler counts as progress a round that only waited for the
watch streams ("reconcile postponed"), which clears its failure record, including that of the pass it owes.

A pass that fails slowly again and again (its reads time out after running a while) makes the watcher unready after
three such failures (docs/architecture.md, readiness: "a pass whose API reads time out"). The reconciler postpones
a pass while either watch stream is anything but live (`views_live`: a failure of a moment, a re-list, a watch
request 1 s unanswered), which the watcher's readiness tolerates for 10 s. When such a blip fell between two failed
passes, the postponed round called `on_progress` and wiped the count: a reconciler that never completed a pass
kept the watcher ready. Now a postponed round is progress only while no pass it owes has failed.

Real parts: redis-server, Ledger, NodeWatcher, PodWatcher, Reconciler.run under a Supervisor (shrunk timings);
the pass is a stand-in that fails after running a while, and the streams' blips are given by `views_live`."""

from __future__ import annotations

import asyncio

import pytest

from shared.config import load_config
from shared.serving.supervise import Supervisor
from shared.store.ledger import Ledger
from tests.redis.test_heal_drift_bound import GoneApi, live_reconciler

pytestmark = pytest.mark.redis

CFG = load_config(env={}, flags={"memoryPerCard": "96,160", "reconcileSeconds": "2"})


async def test_a_reconciler_whose_passes_keep_failing_is_a_problem_despite_stream_blips(ledger: Ledger) -> None:
    rec = await live_reconciler(GoneApi(), ledger, CFG)  # intact: no rebuild in the loop
    rec.check_seconds = 0.1
    looks = 0

    def views_live() -> str:  # every other look, a blip of one stream
        nonlocal looks
        looks += 1
        return "pods: watch request not answered for 1s" if looks % 2 == 0 else ""

    passes = 0

    async def failing_pass() -> dict[str, int]:  # its reads time out after running a while
        nonlocal passes
        passes += 1
        await asyncio.sleep(0.4)
        raise TimeoutError("API read timed out")

    rec.views_live = views_live  # type: ignore[method-assign]
    rec.reconcile_all = failing_pass  # type: ignore[method-assign]
    sup = Supervisor(healthy_after=0.3)
    rec.on_progress = sup.progress("reconciler")
    rec.wake.set()  # a pass owed at once
    sup.spawn("reconciler", rec.run)
    loop = asyncio.get_running_loop()
    try:
        end = loop.time() + 15
        while not sup.problems():
            assert loop.time() < end, (f"ready after {passes} failed passes and {looks} looks: "
                                       f"{sup.tasks['reconciler']}")
            await asyncio.sleep(0.05)
        assert any("reconciler" in p for p in sup.problems()), sup.problems()
        assert passes >= 3 and looks >= 4, (passes, looks)  # (the blips did come between the passes)
    finally:
        await sup.cancel()
