"""Red team, the upkeep stamp (controller/upkeep.py, Ledger.kept): its age told by clocks other than the one that
wrote it.

1. On Redis Cluster redis-py sends TIME to its client's default node, any shard: the watcher stamped with one
   shard's clock and the extender subtracted it from another's, so the skew between two shards' clocks went
   straight into the age: a shard behind by more than watchersLostAfterSeconds made every extender refuse every
   slice pod while the watchers were fine, and one ahead hid an outage of every watcher for as long as the skew.
   Simulated by a TIME answered by another clock than the key's server's; both now read the clock of the server
   that holds the key (the clock script, routed by it).
2. A stamp from the future (Redis's clock stepped back after the watcher's last stamp, or a failover to a
   replica whose clock is behind) read as age 0 until the clock caught up, and a stamp gone after being seen (a
   DEL, the key's shard restarted empty while the others kept their nodes) as "no stamp, no verdict": with every
   watcher down the extenders went on booking, for as long as the step or for ever. Now an extender also counts,
   on its own clock, how long the stamp it reads has not changed: a stamp unchanged for watchersLostAfterSeconds
   is not kept, whatever Redis's clock says of it.
3. A read that failed left the last verdict: "kept" held for ever while the stamp could not be read. On a
   Cluster whose shard holding the stamp is down (cluster-require-full-coverage no) the other shards' nodes go
   on booking, and with every watcher down too nothing ended it. A stamp that cannot be read now ages on the
   extender's clock like one that does not change."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import pytest
from redis.exceptions import ConnectionError

from controller.upkeep import LOOK_EVERY_SECONDS, Upkeep, stamp_while_ready
from shared.domain.upkeep import KEEP_EVERY_SECONDS
from shared.store.ledger import Ledger

pytestmark = pytest.mark.redis

SKEW_S = 600  # ten minutes between two servers' clocks


def skewed_time(ledger: Ledger, monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """The client's TIME answered by a server whose clock is `seconds` ahead of the key's (a cluster's default
    node on another shard)."""
    real = ledger.redis.time

    async def time_elsewhere() -> tuple[int, int]:
        sec, usec = await real()
        return int(sec + seconds), int(usec)

    monkeypatch.setattr(ledger.redis, "time", time_elsewhere)


async def test_the_stamp_age_is_told_by_the_clock_of_the_server_that_holds_it(
        ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    await ledger.mark_kept()
    skewed_time(ledger, monkeypatch, SKEW_S)  # read through a server whose clock is ahead
    age = await ledger.kept_age_ms()
    assert age is not None and age < 5000, f"a stamp just written read as {age} ms old"
    monkeypatch.undo()
    skewed_time(ledger, monkeypatch, SKEW_S)  # written through a server whose clock is ahead ...
    await ledger.mark_kept()
    monkeypatch.undo()
    await ledger.redis.set(ledger.keys.kept, str(int(await ledger.redis.get(ledger.keys.kept)) - 120_000))
    age = await ledger.kept_age_ms()  # ... two minutes ago: read where it is
    assert age is not None and 119_000 <= age < 125_000, age


async def read_until(upkeep: Upkeep, done: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Read the stamp (as the extender's task does, which the supervisor restarts after an error) until `done`,
    or `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ConnectionError):
            await upkeep.read()
        if done():
            return True
        await asyncio.sleep(0.1)
    return False


async def test_a_stamp_from_the_future_ages_on_the_extenders_clock(ledger: Ledger) -> None:
    now = await ledger.redis_time_ms()
    await ledger.redis.set(ledger.keys.kept, str(now + 3_600_000))  # the clock stepped back an hour since
    upkeep = Upkeep(ledger, lost_after_seconds=1)
    await upkeep.read()
    assert upkeep.problem() == "", "just read: kept"
    assert await read_until(upkeep, lambda: bool(upkeep.problem())), \
        "no watcher stamps, yet the stamp from the future keeps the ledger 'kept' for an hour"
    assert "no watcher has kept the ledger current" in upkeep.problem()
    woken: list[int] = []
    upkeep.on_kept.append(lambda: woken.append(1))
    await ledger.mark_kept()  # a watcher is back
    await upkeep.read()
    assert upkeep.problem() == "" and woken == [1]


async def test_a_stamp_gone_after_being_seen_is_not_kept(ledger: Ledger) -> None:
    await ledger.mark_kept()
    upkeep = Upkeep(ledger, lost_after_seconds=1)
    await upkeep.read()
    assert upkeep.problem() == ""
    await ledger.redis.delete(ledger.keys.kept)  # the key's shard restarted empty; every watcher down
    assert await read_until(upkeep, lambda: bool(upkeep.problem())), \
        "the stamp vanished and no watcher stamps: the extender went on placing pods"
    await ledger.mark_kept()
    await upkeep.read()
    assert upkeep.problem() == ""


async def test_no_stamp_ever_seen_still_refuses_nothing(ledger: Ledger) -> None:
    """Unchanged: a Redis that never held a stamp (watchers of a release that does not stamp yet) is no verdict."""
    upkeep = Upkeep(ledger, lost_after_seconds=1)
    await upkeep.read()
    await asyncio.sleep(1.2)  # longer than the limit, on purpose: nothing may change with time here
    await upkeep.read()
    assert upkeep.problem() == ""


async def test_a_stamp_that_cannot_be_read_ages_too(ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    await ledger.mark_kept()
    upkeep = Upkeep(ledger, lost_after_seconds=1)
    await upkeep.read()
    assert upkeep.problem() == ""

    async def unreachable() -> tuple[int | None, int | None]:
        raise ConnectionError("the shard holding the stamp is down")

    monkeypatch.setattr(ledger, "kept", unreachable)
    with pytest.raises(ConnectionError):
        await upkeep.read()  # the task fails (and is restarted): the supervisor counts it
    assert await read_until(upkeep, lambda: bool(upkeep.problem())), \
        "the stamp cannot be read, yet the last verdict 'kept' holds for ever"
    monkeypatch.undo()
    await ledger.mark_kept()
    await upkeep.read()
    assert upkeep.problem() == ""


async def test_a_failed_read_does_not_lift_a_refusal(ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    """(A first version of the fix for 3 judged a failed read by this process's count since it first read the
    stamp alone: an extender started after the watchers had gone read a stamp two hours old, then, its next read
    failing, took it for 5 s old and placed pods again.)"""
    await ledger.redis.set(ledger.keys.kept, str(await ledger.redis_time_ms() - 7_200_000))
    upkeep = Upkeep(ledger, lost_after_seconds=90)
    woken: list[int] = []
    upkeep.on_kept.append(lambda: woken.append(1))
    await upkeep.read()
    assert "for 7200 s" in upkeep.problem(), upkeep.problem()

    async def unreachable() -> tuple[int | None, int | None]:
        raise ConnectionError("Redis away")

    monkeypatch.setattr(ledger, "kept", unreachable)
    with pytest.raises(ConnectionError):
        await upkeep.read()
    assert "for 7200 s" in upkeep.problem() and woken == [], upkeep.problem()


async def test_a_stamp_of_another_type_is_not_a_stamp(ledger: Ledger) -> None:
    """4. `<prefix>:kept` of another type (a hash an operator or another program wrote there) made every read raise
    WRONGTYPE, a ResponseError the supervisor counts as a bug: after five in a row the extender process gave up,
    and restarted into the same (a crash loop while no watcher overwrites it). It is now no stamp, like one that
    is not a number; a watcher's next stamp replaces it (SET)."""
    await ledger.mark_kept()
    upkeep = Upkeep(ledger, lost_after_seconds=1)
    await upkeep.read()
    await ledger.redis.delete(ledger.keys.kept)
    await ledger.redis.hset(ledger.keys.kept, "at", "1")
    assert await ledger.kept() == (None, None)
    assert await read_until(upkeep, lambda: bool(upkeep.problem())), "seen before: it ages on the extender's clock"
    await ledger.mark_kept()
    stamp, age = await ledger.kept()
    assert stamp is not None and age is not None and age < 2000


async def test_a_watcher_stamps_as_soon_as_it_is_ready(ledger: Ledger) -> None:
    """5. The watcher's stamp task looked at its readiness only every 10 s (KEEP_EVERY_SECONDS): spawned with the
    watch streams, its first look found them not listed yet, so a watcher that came back stamped up to 10 s
    after it was ready, and the pods turned away waited that much longer than the runbook's "the first ready
    watcher rebuilds the ledger at its start and stamps it". An unready watcher now looks again every second.
    (Its stamps an hour apart here: a watcher that waited for its next stamp after an unready look never stamps.)"""
    assert LOOK_EVERY_SECONDS <= 1.0 < KEEP_EVERY_SECONDS  # the runbook's "within a second of becoming ready"
    problems = ["pods: not listed yet"]
    looked = asyncio.Event()

    def readiness() -> list[str]:
        looked.set()
        return problems

    task = asyncio.create_task(stamp_while_ready(ledger, readiness, every=3600.0, look_every=0.05))
    try:
        await asyncio.wait_for(looked.wait(), 10)  # its first look: not ready
        assert await ledger.kept_age_ms() is None
        problems.clear()  # the streams listed
        for _ in range(600):  # bounds a hang only
            if await ledger.kept_age_ms() is not None:
                break
            await asyncio.sleep(0.05)
        assert await ledger.kept_age_ms() is not None, "ready, and not stamped before its next stamp is due"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
