"""The ledger's upkeep stamp on a real redis-server: a ready watcher stamps it, an extender that reads it too old
places no slice pod (filter refuses every node, bind books nothing, both saying why), pods asking for no slice are
not affected, and once a watcher stamps it again the pods turned away meanwhile are woken (a `wake` notice the
watchers' Nudger turns into a Node patch). shared/domain/upkeep.py, controller/upkeep.py."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

import pytest

from controller.extender import Extender
from controller.nudger import Nudger
from controller.upkeep import Upkeep, stamp_while_ready
from shared.domain.node import node_inventory
from shared.store.ledger import Ledger
from tests.redis.conftest import MirrorFactory
from tests.redis.test_claim_wake import NodePatches, until
from tests.redis.test_extender_bind import CFG, FakeKube, node, pod

pytestmark = pytest.mark.redis

SLICE = {"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 16, "mthreads.com/sgpu-core": 4}


async def stamp_aged(ledger: Ledger, seconds: float) -> None:
    """The stamp a watcher left `seconds` ago (Redis's clock) and none since."""
    await ledger.redis.set(ledger.keys.kept, str(await ledger.redis_time_ms() - int(seconds * 1000)))


async def test_the_stamp_reads_back_its_age_and_nothing_when_absent_or_foreign(ledger: Ledger) -> None:
    assert await ledger.kept_age_ms() is None
    await ledger.mark_kept()
    age = await ledger.kept_age_ms()
    assert age is not None and 0 <= age < 2000, age
    await stamp_aged(ledger, 120)
    age = await ledger.kept_age_ms()
    assert age is not None and 119_000 <= age < 125_000, age
    await ledger.redis.set(ledger.keys.kept, "not a time")
    assert await ledger.kept_age_ms() is None


async def test_a_watcher_stamps_only_while_ready(ledger: Ledger) -> None:
    problems: list[str] = ["pods: stream failing for 12s"]
    task = asyncio.create_task(stamp_while_ready(ledger, lambda: problems, every=0.02))
    try:
        await asyncio.sleep(0.2)  # ten rounds, all unready
        assert await ledger.kept_age_ms() is None
        problems.clear()

        async def stamped() -> bool:
            return await ledger.kept_age_ms() is not None

        for _ in range(100):
            if await stamped():
                break
            await asyncio.sleep(0.02)
        assert await stamped()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_an_unkept_ledger_places_no_slice_pod_and_wakes_the_refused_once_kept(
        ledger: Ledger, mirror_factory: MirrorFactory) -> None:
    for name in ("n-a", "n-b"):
        await ledger.upsert_node(node_inventory(node(name, 96, 2), CFG))
    m = await mirror_factory()
    ext = Extender(CFG, m.ledger, m, FakeKube())  # type: ignore[arg-type]
    upkeep = Upkeep(m.ledger, lost_after_seconds=90)
    ext.unkept = upkeep.problem
    upkeep.on_kept.append(ext.kept_again)
    watcher_mirror = await mirror_factory()
    patches = NodePatches()
    watcher_mirror.on_notice["wake"].append(Nudger(patches, interval=0.01, follow_up=0).nudge)  # type: ignore[arg-type]

    def filtered(uid: str, limits: dict[str, Any] | None = None) -> dict[str, Any]:
        return ext.filter({"Pod": pod(uid, limits or SLICE), "NodeNames": ["n-b", "n-a"]})

    assert filtered("before")["NodeNames"], "kept (no stamp at all): placed"
    await stamp_aged(m.ledger, 91)
    await upkeep.read()
    got = filtered("during")
    assert got["NodeNames"] == [] and set(got["FailedAndUnresolvableNodes"]) == {"n-a", "n-b"}, got
    why = got["FailedAndUnresolvableNodes"]["n-a"]
    said = re.search(r"no watcher has kept the ledger current for (\d+) s", why)
    assert said and 91 <= int(said.group(1)) < 120, why  # 91 s and what this test took since
    assert filtered("plain", {"cpu": "1"})["NodeNames"] == ["n-b", "n-a"]  # no slice asked: not our business
    # a pod filtered before the stamp aged, its bind after
    out = await ext.bind({"PodName": "p-before", "PodNamespace": "ns", "PodUID": "before", "Node": "n-b"})
    assert "no watcher has kept the ledger" in out["Error"], out
    assert not any(s.reservations for s in (await m.ledger.snapshots(["n-a", "n-b"])).values())  # nothing booked
    assert patches.patched == []  # nobody woken while it lasts

    await m.ledger.mark_kept()  # a watcher is back
    await upkeep.read()
    assert upkeep.problem() == ""
    assert await until(lambda: patches.patched == ["n-a"]), patches.patched  # the refused pod's first candidate
    assert filtered("after")["NodeNames"]
    await ext.settled()


async def test_the_pods_woken_are_bounded(ledger: Ledger, mirror_factory: MirrorFactory,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import controller.extender as extender_module

    monkeypatch.setattr(extender_module, "UNKEPT_WAKE_MAX", 3)
    names = [f"w-{i:02d}" for i in range(6)]
    for name in names:
        await ledger.upsert_node(node_inventory(node(name, 96, 1), CFG))
    m = await mirror_factory()
    ext = Extender(CFG, m.ledger, m, FakeKube())  # type: ignore[arg-type]
    woken: list[str] = []
    ext._wake = woken.append  # type: ignore[method-assign]
    refusing: Callable[[], str] = lambda: "unkept"  # noqa: E731
    ext.unkept = refusing
    for i, name in enumerate(names):  # pods each with one candidate node of their own
        ext.filter({"Pod": pod(f"p{i}", SLICE), "NodeNames": [name]})
    ext.kept_again()
    assert woken == names[:3]
    ext.kept_again()
    assert woken == names[:3]  # each wake sent once


async def test_the_card_table_says_when_no_watcher_keeps_the_ledger(ledger: Ledger) -> None:
    from controller.cards import card_table

    await ledger.upsert_node(node_inventory(node("t-1", 96, 1), CFG))
    for stamp in (None, 0.0):  # none, or a fresh one: the table as ever
        if stamp is not None:
            await stamp_aged(ledger, stamp)
        assert "NOT KEPT" not in await card_table(ledger, 90)
    await stamp_aged(ledger, 200)
    last = (await card_table(ledger, 90)).splitlines()[-1]
    said = re.match(r"NOT KEPT: no watcher has kept the ledger current for (\d+) s", last)
    assert said and 200 <= int(said.group(1)) < 230, last  # 200 s and what this test took since


async def test_a_watcher_back_after_no_watcher_kept_the_ledger_wakes_the_pods_turned_away(ledger: Ledger) -> None:
    """The extenders turned slice pods away while the stamp was stale, and one that restarted since no longer knows
    which: the watcher's first stamp after such an outage (or where none was) is followed by one wake, `wake_after`
    it; a watcher that finds the stamp fresh (another replica kept it) and later stamps wake nobody. Each phase
    runs until the watcher has stamped so often, and ends once a wake its first stamp scheduled is past (waited
    for, not slept: a slow Redis makes it later, not missing or counted in the next phase)."""
    woken: list[float] = []
    loop = asyncio.get_running_loop()
    problems: list[str] = []
    stamps: list[float] = []
    real_mark = ledger.mark_kept

    async def mark_kept() -> None:
        await real_mark()
        stamps.append(loop.time())

    ledger.mark_kept = mark_kept  # type: ignore[method-assign]
    wake_after = 0.05
    looks: list[float] = []  # each time the watcher asked whether it is ready

    def ready() -> list[str]:
        looks.append(loop.time())
        return problems

    def watcher() -> asyncio.Task[None]:
        return asyncio.create_task(stamp_while_ready(ledger, ready, every=0.02, lost_after_seconds=90,
                                                     kept_again=lambda: woken.append(loop.time()),
                                                     wake_after=wake_after))

    async def past_the_wake_of(wakes: int) -> None:
        """Until `wakes` wakes were made, and one the last stamp may have scheduled is well past (the watcher is
        stopped by then: no stamp comes after it)."""
        assert await until(lambda: len(woken) >= wakes, 30), woken
        due = stamps[-1] + wake_after + 0.3  # (past the last stamp's too: a wake per stamp would show)
        assert await until(lambda: loop.time() > due, 30)

    async def run(n: int, wakes: int) -> None:
        first = len(stamps)
        task = watcher()
        try:
            assert await until(lambda: len(stamps) >= first + n, 30), stamps
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await past_the_wake_of(wakes)

    await stamp_aged(ledger, 120)  # the last watcher stopped 2 minutes ago
    await run(5, wakes=1)
    assert len(woken) == 1, woken  # once, for the first stamp, not for the four after it
    assert woken[0] >= stamps[0] + wake_after - 0.001, (woken, stamps)  # and `wake_after` it, not at once
    age = await ledger.kept_age_ms()
    assert age is not None and age < 10_000  # and the stamp is fresh (the old one was 120 s old)
    await run(5, wakes=1)  # a watcher starting beside a fresh stamp: nobody was turned away
    assert len(woken) == 1, woken
    await ledger.redis.delete(ledger.keys.kept)  # none at all (a Redis restarted empty): an extender may have refused
    await run(3, wakes=2)
    assert len(woken) == 2, woken
    problems.append("pods: stream failing for 12s")  # unready, then ready again beside its own fresh stamp
    first, looked = len(stamps), len(looks)
    task = watcher()
    try:
        assert await until(lambda: len(looks) >= looked + 5, 30)  # five rounds unready ...
        assert len(stamps) == first  # ... stamping nothing
        problems.clear()
        back = len(stamps)
        assert await until(lambda: len(stamps) >= back + 2, 30)  # ready: stamping again
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    await past_the_wake_of(wakes=2)
    assert len(woken) == 2, woken  # the stamp it found was fresh
