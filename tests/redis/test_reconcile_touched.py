"""A pod bound without a record that comes or goes has the reconciler compare its node only, soon; a pass over
every node stays periodic. Before, each such pod woke a pass over every node: at 5,000 nodes a burst of pods
that bypass the webhook kept the watcher and Redis reading every node back to back.

Real parts: redis-server, the product's Ledger, NodeWatcher, PodWatcher and Reconciler. The API client is a
stand-in no call here may reach."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from redis.asyncio import Redis

from controller.node_watch import NodeWatcher
from controller.pod_watch import PodWatcher
from controller.reconciler import Reconciler
from controller.watchers import wire
from shared.config import load_config
from shared.domain.state import NodeSnapshot
from shared.store.ledger import Ledger, Reread
from shared.store.mirror import Mirror
from tests.redis.test_redteam_inflight_nodes import NoKube, gpu_node

pytestmark = pytest.mark.redis
CFG = load_config(env={}, flags={"memoryPerCard": "96,160", "reconcileSeconds": "300"})


def unrecorded_pod(uid: str, node: str) -> dict[str, Any]:
    """Bound to `node`, asks for a slice, carries no allocation record (it bypassed admission)."""
    limits = {"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "8", "mthreads.com/sgpu-core": "2"}
    return {"metadata": {"name": f"p-{uid}", "namespace": "ns", "uid": uid, "annotations": {}},
            "spec": {"nodeName": node, "schedulerName": "hami-scheduler",
                     "containers": [{"name": "c", "resources": {"limits": limits}}]},
            "status": {"phase": "Running"}}


async def setup(ledger: Ledger) -> tuple[Reconciler, PodWatcher]:
    nodes = NodeWatcher(NoKube(), ledger, CFG)  # type: ignore[arg-type]
    for name in ("ta", "tb"):
        await nodes.on_event("ADDED", gpu_node(name))
    pods = PodWatcher(NoKube(), ledger, Mirror(ledger), CFG, nodes.lost)  # type: ignore[arg-type]
    wire(nodes, pods)
    rec = Reconciler(NoKube(), ledger, CFG, nodes, pods, check_seconds=0.05)  # type: ignore[arg-type]
    pods.unaccounted_changed = rec.touch  # as controller/roles.py wires them
    return rec, pods


async def drift(redis: Redis, ledger: Ledger, node: str) -> None:
    """Usage on a card that no reservation explains (an edit behind the scripts' back)."""
    await redis.hset(ledger.keys.card(node, 0), "mem_used", 40)  # type: ignore[misc]


async def mem_used(ledger: Ledger, node: str) -> int:
    return (await ledger.snapshots([node]))[node].cards[0].mem_used


async def test_an_unrecorded_pod_touches_its_node_only(ledger: Ledger, redis_client: Redis) -> None:
    rec, pods = await setup(ledger)
    pods.learn("u1", unrecorded_pod("u1", "ta"))
    assert rec.touched == {"ta"} and not rec.wake.is_set()
    rec.touched.clear()
    pods.learn("u1", unrecorded_pod("u1", "ta"))  # nothing changed: no touch
    assert rec.touched == set()
    await pods.release("u1", unrecorded_pod("u1", "ta"), "deleted")
    assert rec.touched == {"ta"} and not rec.wake.is_set()
    rec.touch("")  # a pod on no known node: every node
    assert rec.wake.is_set()


async def test_a_touched_pass_compares_those_nodes_and_no_other(ledger: Ledger, redis_client: Redis) -> None:
    rec, pods = await setup(ledger)
    await drift(redis_client, ledger, "ta")
    await drift(redis_client, ledger, "tb")
    pods.learn("u1", unrecorded_pod("u1", "ta"))
    repaired = await rec.reconcile_nodes({"ta"})
    assert repaired  # the quarantine, and the usage recomputed from reservations
    snaps = await ledger.snapshots(["ta", "tb"])
    assert "quarantined" in snaps["ta"].error and "ns/p-u1" in snaps["ta"].error
    assert snaps["ta"].cards[0].mem_used == 0
    assert await mem_used(ledger, "tb") == 40 and not snaps["tb"].error  # not compared
    assert rec.last_pass == {}  # a pass over every node is still to come (its metrics, its timestamp)
    await rec.reconcile_all()
    assert await mem_used(ledger, "tb") == 0 and rec.last_pass["nodes"] == 2


async def test_the_loop_compares_a_touched_node_long_before_the_next_full_pass(ledger: Ledger,
                                                                                redis_client: Redis) -> None:
    rec, pods = await setup(ledger)
    await redis_client.set(ledger.epoch_key, "1")  # what a rebuild leaves: the ledger is intact, none here
    rec.views_live = lambda: ""  # type: ignore[method-assign]  # both streams live (no API here)
    await drift(redis_client, ledger, "tb")
    task = asyncio.create_task(rec.run())
    try:
        pods.learn("u1", unrecorded_pod("u1", "ta"))
        for _ in range(400):  # bounded wait on the condition (the full pass is 300 s away)
            if "quarantined" in ((await ledger.snapshots(["ta"]))["ta"].error):
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("the touched node was not compared")
        assert await mem_used(ledger, "tb") == 40  # only the touched node
        assert not task.done()
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_quarantine_follows_every_change_of_the_unrecorded_pods(ledger: Ledger) -> None:
    """quarantine(node) reads an index by node, made again after any change: never a stale answer."""
    _, pods = await setup(ledger)
    assert pods.quarantine("ta") == ""
    pods.learn("u1", unrecorded_pod("u1", "ta"))
    assert "ns/p-u1" in pods.quarantine("ta") and pods.quarantine("tb") == ""
    pods.learn("u2", unrecorded_pod("u2", "tb"))
    assert "ns/p-u2" in pods.quarantine("tb") and "ns/p-u2" not in pods.quarantine("ta")
    await pods.release("u1", unrecorded_pod("u1", "ta"), "deleted")
    assert pods.quarantine("ta") == "" and "ns/p-u2" in pods.quarantine("tb")
    unbound = unrecorded_pod("u2", "")
    pods.learn("u2", unbound)  # no longer bound: no longer unrecorded
    assert pods.quarantine("tb") == ""
    pods.learn("u3", unrecorded_pod("u3", "tb"))
    assert "ns/p-u3" in pods.quarantine("tb")
    await pods.on_sync([unrecorded_pod("u4", "ta")])  # a re-list replaces the view whole
    assert pods.quarantine("tb") == "" and "ns/p-u4" in pods.quarantine("ta")


async def test_a_repair_nudges_kube_scheduler_about_its_node_only(ledger: Ledger, redis_client: Redis) -> None:
    """A repair may free cards (stale bookings dropped, usage recomputed): kube-scheduler retries the pods it
    parked after our filter refused them there now, not at its 5-minute flush. A clean node is not nudged."""
    rec, pods = await setup(ledger)
    nudged: list[str] = []
    pods.nudger.nudge = nudged.append  # type: ignore[method-assign]
    await drift(redis_client, ledger, "ta")
    assert await rec.reconcile_nodes({"ta", "tb"})
    assert nudged == ["ta"] and await mem_used(ledger, "ta") == 0
    nudged.clear()
    assert not await rec.reconcile_nodes({"ta", "tb"})  # nothing left to repair
    assert nudged == []


async def test_a_pass_takes_the_mirrors_snapshot_of_an_unchanged_node_and_still_finds_drift(
        ledger: Ledger, redis_client: Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass reads every node from Redis, but a reply that is the very text the watcher's mirror decoded its
    snapshot from is not decoded again (Reconciler._read): the mirror's snapshot is that value. Drift behind
    the scripts' back changes the reply, so it is decoded and repaired as before; a node the mirror changed
    after its digest was taken is read once more rather than trusted."""
    rec, pods = await setup(ledger)
    mirror = pods.mirror
    await mirror.resync(full=True)
    skipped: list[set[str]] = []
    real = ledger.reread

    async def recording(nodes: list[str], previous: dict[str, int],
                  isolate: bool = False, apart: object = ()) -> Reread:
        out = await real(nodes, previous, isolate, apart)  # type: ignore[arg-type]
        skipped.append(set(out.unchanged))
        return out

    monkeypatch.setattr(ledger, "reread", recording)
    assert await rec.reconcile_all() == {} and skipped[-1] == {"ta", "tb"}  # nothing decoded
    await drift(redis_client, ledger, "ta")
    assert await rec.reconcile_all()  # the usage recomputed from the reservations
    assert skipped[-1] == {"tb"} and await mem_used(ledger, "ta") == 0
    await mirror.resync()  # the repair's own feed message never reached this mirror (it is not started)
    assert mirror.nodes == await ledger.snapshots(["ta", "tb"])

    changed_here: list[str] = []
    snapshots = ledger.snapshots

    async def counting(nodes: list[str]) -> dict[str, NodeSnapshot]:
        changed_here.extend(nodes)
        return await snapshots(nodes)

    async def reread_then_change(nodes: list[str], previous: dict[str, int],
                  isolate: bool = False, apart: object = ()) -> Reread:
        out = await real(nodes, previous, isolate, apart)  # type: ignore[arg-type]
        mirror.put(dataclasses.replace(mirror.nodes["tb"], error="forged here"))  # as a feed message meanwhile
        return out

    monkeypatch.setattr(ledger, "reread", reread_then_change)
    monkeypatch.setattr(ledger, "snapshots", counting)
    assert await rec.reconcile_all() == {}  # tb read again: Redis's value, which is clean
    assert changed_here == ["tb"]


async def restarted_until_repaired(rec: Reconciler, ledger: Ledger, node: str, what: str) -> None:
    """Run the loop again, as the supervisor restarts the task, until `node`'s drift is repaired."""
    task = asyncio.create_task(rec.run())
    try:
        for _ in range(400):
            if await mem_used(ledger, node) == 0:
                return
            await asyncio.sleep(0.02)
        raise AssertionError(what)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_touched_pass_that_fails_keeps_its_nodes_for_the_next_one(ledger: Ledger, redis_client: Redis) -> None:
    """Red team: the touched nodes were taken before the pass; one that raises (Redis away a moment) lost them
    until the next full pass (reconcileSeconds), among them an unverified node's second comparison."""
    rec, _pods = await setup(ledger)
    await redis_client.set(ledger.epoch_key, "1")
    rec.views_live = lambda: ""  # type: ignore[method-assign]
    real = rec.reconcile_nodes
    calls: list[set[str]] = []

    async def failing_once(nodes: set[str]) -> dict[str, int]:
        calls.append(set(nodes))
        if len(calls) == 1:
            raise ConnectionError("Redis went away for a moment")
        return await real(nodes)

    rec.reconcile_nodes = failing_once  # type: ignore[method-assign]
    await drift(redis_client, ledger, "ta")
    rec.touch("ta")
    with pytest.raises(ConnectionError):
        await rec.run()
    assert rec.touched == {"ta"}  # kept: the restarted loop compares it
    await restarted_until_repaired(rec, ledger, "ta", "the touched node was not compared after the failed pass")
    assert calls[:2] == [{"ta"}, {"ta"}]


async def test_a_full_pass_that_fails_is_run_again_by_the_restarted_loop(ledger: Ledger, redis_client: Redis) -> None:
    """Red team: a full pass that raised (the API server failing the read of an unverified node's pods) cleared
    its wake-up, and the restarted loop waited reconcileSeconds before the next one, fenced nodes included."""
    rec, _pods = await setup(ledger)
    await redis_client.set(ledger.epoch_key, "1")
    rec.views_live = lambda: ""  # type: ignore[method-assign]
    rec.interval = 3600.0  # no pass comes by the clock in this test
    real = rec.reconcile_all
    calls = 0

    async def failing_once() -> dict[str, int]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("the API server failed the read")
        return await real()

    rec.reconcile_all = failing_once  # type: ignore[method-assign]
    await drift(redis_client, ledger, "ta")
    rec.wake.set()
    with pytest.raises(ConnectionError):
        await rec.run()
    assert rec.wake.is_set()  # kept: the restarted loop passes at once
    await restarted_until_repaired(rec, ledger, "ta", "no full pass after the failed one")
    assert calls == 2


async def test_a_postponed_pass_is_said_once_per_episode(ledger: Ledger, redis_client: Redis,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """The runbook's MtschedLedgerNotReconciled points at `reconcile postponed` in the watcher's log: said at
    info when the streams stop being live, not at every check (its reason counts seconds, so it changes every
    time: red team, 2026-12-05), and `reconcile resumed` when they are live again."""
    rec, _pods = await setup(ledger)
    await redis_client.set(ledger.epoch_key, "1")
    ticks = 0

    def down() -> str:
        nonlocal ticks
        ticks += 1
        return f"pods: stream failing for {ticks}s"

    rec.views_live = down  # type: ignore[method-assign]
    rec.wake.set()
    caplog.set_level("INFO", logger="mtsched.reconciler")
    task = asyncio.create_task(rec.run())
    try:
        for _ in range(400):  # bounded: until several checks were postponed
            if ticks >= 5:
                break
            await asyncio.sleep(0.02)
        rec.views_live = lambda: ""  # type: ignore[method-assign]
        for _ in range(400):
            if any("reconcile resumed" in r.getMessage() for r in caplog.records):
                break
            await asyncio.sleep(0.02)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    said = [r.getMessage() for r in caplog.records if r.levelname == "INFO" and "reconcile " in r.getMessage()]
    assert ticks >= 5 and said[:2] == ["reconcile postponed: pods: stream failing for 1s",
                                      "reconcile resumed: the watch streams are live again"], said
