"""Red team of f532973 (Supervisor.progress): the watchers' `bound-records` task (PodWatcher.confirm_deferred, the
records held for our bind's confirmation) is a supervised task that fails on Redis too, and had no progress hook.

docs/runbooks.md, Faults, "Redis stops answering (SIGSTOP)": the extenders *and the watchers* are ready again within
11 s of Redis answering; a task that failed slowly meanwhile counts as working at its first unit of work that
succeeds. A watcher holding a record when Redis froze has `bound-records` fail slowly at each try (each send waits
out the socket timeout and the ledger's resends); three such failures make the watcher unready, and before, that
lasted `proven_after` (60 s) after Redis answered, its confirmations working notwithstanding. Meanwhile the watcher
stamps nothing (the stamp waits for the rest of the role: `stamp_while_ready`), so a freeze of 30 s or more left the
extenders past `watchersLostAfterSeconds` (90 s), turning every slice pod away.

The timings are shrunk (a socket timeout of 0.6 s, a supervisor that counts a run of 0.5 s as "a while"), the parts
real: redis-server (SIGSTOPped), Ledger, Mirror, PodWatcher, Supervisor, wired as `run_watcher` wires it."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable

import pytest

from controller.pod_watch import PodWatcher
from controller.roles import spawn_bound_records
from deploy.local.redis import RedisServer, new_password
from shared.kube import Kube
from shared.serving.supervise import Supervisor
from shared.store.ledger import Ledger, connect
from shared.store.mirror import Mirror
from tests.redis.conftest import WATCHER_CFG
from tests.redis.helpers import S4000, inventory
from tests.redis.test_watcher_records import pod

pytestmark = pytest.mark.redis

READY_AGAIN_WITHIN = 3.0  # the task's restart backoff (0.2 s, its failures counted anew by each slow one) + a try


async def _within(what: str, cond: Callable[[], bool], bound: float) -> float:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    while not cond():
        assert loop.time() - t0 < bound, f"not within {bound:g} s: {what}"
        await asyncio.sleep(0.05)
    return loop.time() - t0


async def test_a_watcher_holding_a_record_is_ready_again_once_redis_answers() -> None:
    server = RedisServer(password=new_password()).start()
    proc = server.proc
    assert proc is not None
    led = Ledger(connect(server.url))
    own = Ledger(connect(f"{server.url}?socket_timeout=0.6"))  # the watcher's, its sends given up on sooner
    own.retry_seconds, own.connection_retries = 0.2, 0
    mirror = Mirror(led)
    sup = Supervisor(healthy_after=0.5)
    frozen = False
    try:
        await led.load_scripts()
        await led.upsert_node(inventory("n4", S4000))
        await mirror.start()
        await asyncio.wait_for(mirror.ready.wait(), 5)
        w = PodWatcher(Kube(None), own, mirror, WATCHER_CFG, asyncio.Event())  # type: ignore[arg-type]
        w.bound_grace = 0.2
        assert (await led.reserve("n4", "u1", [0], 2, 1, 1, pod="ns/u1"))[0].ok  # our bind's booking, pending
        await _within("the mirror shows the booking", lambda: "u1" in mirror.nodes["n4"].reservations, 5)
        os.kill(proc.pid, signal.SIGSTOP)  # the bind's confirmation never comes: Redis froze
        frozen = True
        await w.on_event("MODIFIED", pod("u1"))  # the record, held for the confirmation
        assert "u1" in w.deferred
        spawn_bound_records(sup, w)
        task = sup.tasks["bound-records"]
        await _within("bound-records failed slowly three times", lambda: task.slow_failures >= 3, 30)
        assert any("bound-records" in p for p in sup.problems()), sup.problems()
        os.kill(proc.pid, signal.SIGCONT)
        frozen = False
        await _within("the record confirmed", lambda: not w.deferred and "u1" in w.seen, 10)
        took = await _within(f"ready again (unready for: {sup.problems()})", lambda: not sup.problems(),
                             READY_AGAIN_WITHIN)
        snap = await led.snapshot("n4")
        assert snap is not None and snap.reservations["u1"].state == "bound"
        print(f"\nready again {took:.1f}s after the record was confirmed")
    finally:
        if frozen:
            os.kill(proc.pid, signal.SIGCONT)
        await sup.cancel()
        await mirror.stop()
        await own.redis.aclose()
        await led.redis.aclose()
        server.cleanup()
