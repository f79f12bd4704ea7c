"""Red team: a Redis that cannot persist refuses every write with MISCONF, and the watchers crash-loop.

An external Redis with persistence (RDB `save` points or AOF: a managed Redis, a Sentinel group's data nodes) whose
disk is full, read-only or gone refuses every write (`stop-writes-on-bgsave-error yes`, Redis's default, and any AOF
write error) with `MISCONF ...` until a save works again (space freed: Redis retries the snapshot by itself). redis-py
raises it as a plain ResponseError, the Ledger's scripts as a LedgerError wrapping one, which the supervisor took for
"a bug" (shared/serving/supervise.py is_transient): the watcher's upkeep stamp (and its janitor's and reconciler's
writes), failing at once and again while the Redis probe was still fresh, made the role give up within seconds, exit 1
and crash-loop, with the kubelet's growing back-off, for a fault a restart cannot cure, instead of staying up, unready
(`redis: ... MISCONF ...`), and going on as soon as Redis takes writes again (docs/runbooks.md: "Transient failures
never make a role exit"). NOREPLICAS and BUSY had the same flaw (tests/redis/test_redteam_refusals_transient.py).

Real parts: redis-server made unable to save (its snapshot's file name taken by a directory), open_ledger, the
Supervisor, and the watcher's upkeep task wired as controller/roles.py run_watcher wires it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from redis import exceptions as rexc

from controller.upkeep import stamp_while_ready
from deploy.local.redis import RedisServer, new_password
from shared.config import load_config
from shared.serving.supervise import Supervisor, is_transient
from shared.store.ledger import LedgerError
from shared.store.session import open_ledger
from tests.redis.helpers import S4000, inventory

pytestmark = pytest.mark.redis

UNREADY_WITHIN = 6.2 + 2.0  # the Redis probe's 6 s (docs/runbooks.md), one probe period more
READY_WITHIN = 11.0 + 2.0  # as after a freeze: at worst a task's restart back-off, 10 s


def _cannot_save(server: RedisServer) -> Callable[[], None]:
    """Make `server` refuse writes with MISCONF (a failed background save with save points set); returns the cure."""
    with server.client() as c:
        blocker = Path(str(c.config_get("dir")["dir"])) / "dump.rdb"
        c.config_set("save", "3600 1")
        blocker.mkdir()  # the snapshot's rename onto it fails, as on a full or read-only disk
        c.bgsave()
        for _ in range(200):
            info = c.info("persistence")
            if not info["rdb_bgsave_in_progress"] and info["rdb_last_bgsave_status"] == "err":
                break
            time.sleep(0.05)
        assert info["rdb_last_bgsave_status"] == "err", info

    def cure() -> None:
        blocker.rmdir()
        with server.client() as c:
            c.bgsave()
            for _ in range(200):
                if c.info("persistence")["rdb_last_bgsave_status"] == "ok":
                    return
                time.sleep(0.05)
            raise AssertionError("the background save did not work again")
    return cure


async def test_misconf_is_transient_for_a_script_and_a_plain_command() -> None:
    server = RedisServer(password=new_password()).start()
    sup = Supervisor()
    cfg = load_config(env={}, flags={"redisUrl": server.url})
    ledger, mirror = await asyncio.wait_for(open_ledger(cfg, sup), 10)
    try:
        await ledger.upsert_node(inventory("n1", S4000))
        cure = _cannot_save(server)
        with pytest.raises(LedgerError, match="MISCONF") as script:
            await ledger.reserve("n1", "u1", [0], 8, 2, 1, pod="ns/p1")  # (the janitor's and reconciler's alike)
        with pytest.raises(rexc.ResponseError, match="MISCONF") as plain:
            await ledger.mark_kept()  # the watchers' upkeep stamp
        cure()
        await ledger.mark_kept()
        assert is_transient(script.value), f"a task failing so five times exits the role: {script.value!r}"
        assert is_transient(plain.value), f"a task failing so five times exits the role: {plain.value!r}"
    finally:
        await sup.cancel()
        await ledger.redis.aclose()
        await mirror.subscriber.aclose()
        server.cleanup()


async def _within(what: str, cond: Callable[[], bool], bound: float, sup: Supervisor) -> float:
    loop = asyncio.get_running_loop()
    start = loop.time()
    while not cond():
        assert not sup.failed.is_set(), f"the role gave up (exit 1, a crash loop): {sup.fatal}"
        assert loop.time() - start < bound, f"not within {bound:.1f}s: {what}: {sup.problems()}"
        await asyncio.sleep(0.1)
    return loop.time() - start


async def test_a_watcher_stays_up_unready_while_redis_cannot_persist_and_stamps_again_after() -> None:
    server = RedisServer(password=new_password()).start()
    sup = Supervisor()
    opened = None
    try:
        cfg = load_config(env={}, flags={"redisUrl": server.url})
        opened = ledger, _ = await asyncio.wait_for(open_ledger(cfg, sup), 10)
        stamps: list[float] = []
        sup.spawn("upkeep", lambda: stamp_while_ready(ledger, lambda: sup.problems(but="upkeep"), every=0.5,
                                                      progress=lambda: (stamps.append(time.monotonic()),
                                                                        sup.progress("upkeep")())[-1]))
        await _within("ready and stamping", lambda: not sup.problems() and bool(stamps), 15, sup)
        cure = _cannot_save(server)
        await _within("unready, naming the refusal",
                      lambda: any("MISCONF" in p for p in sup.problems()), UNREADY_WITHIN, sup)
        end = asyncio.get_running_loop().time() + 6.0  # and still up, unready, for a while
        while asyncio.get_running_loop().time() < end:
            assert not sup.failed.is_set(), f"the role gave up (exit 1, a crash loop): {sup.fatal}"
            assert sup.problems()
            await asyncio.sleep(0.2)
        cure()
        healed = time.monotonic()
        took = await _within("ready again", lambda: not sup.problems() and stamps[-1] > healed, READY_WITHIN, sup)
        print(f"ready and stamping again {took:.1f}s after Redis took writes again")
    finally:
        await sup.cancel()
        if opened is not None:
            await opened[0].redis.aclose()
            await opened[1].subscriber.aclose()
        server.cleanup()
