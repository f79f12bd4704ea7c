"""A pod deleted while the node watcher writes its node (found flaky under CPU load in
tests/redis/test_redteam_janitor_stress.py: "still booked on c, where it was bound, after the watcher handled its
deletion").

The node watcher writes a node that offers no card (deleted, capacity 0) on placeholder cards with its holders'
usage, read from the pod view before its Redis calls. A holder's pod deleted meanwhile is released by the pod watcher,
and that release can reach Redis before the node's write, which then booked the pod again: nothing released it until
the reconciler's pass judged the booking (reconcileSeconds + the keep window later), its cards unusable until then.

Real parts: redis-server, the product's Ledger, Mirror, NodeWatcher and PodWatcher (wired as the watcher role wires
them). The interleaving is made deterministic: the pod's deletion is handled while the node's write is on its way."""

from __future__ import annotations

from typing import Any

import pytest

from controller.reconciler import Reconciler
from shared.store.ledger import Ledger
from tests.redis.helpers import S4000, all_violations, inventory
from tests.redis.test_redteam_inflight_nodes import CFG, NoKube, bound_pod, gpu_node, live_on, pods_of, watcher

pytestmark = pytest.mark.redis


@pytest.mark.parametrize("node_event", ["DELETED", "MODIFIED"], ids=["node deleted", "capacity dropped to 0"])
async def test_a_holder_deleted_while_its_node_is_written_is_not_booked_again(ledger: Ledger,
                                                                              node_event: str) -> None:
    nodes, pods = await live_on(ledger, "rw")
    pod = bound_pod("h1", "rw", 0, 64 * 1024, 12)
    await pods.on_event("ADDED", pod)  # bound, with its record: booked, and a holder in the view
    assert "h1" in (await ledger.snapshots(["rw"]))["rw"].reservations
    assert "h1" in nodes.holders("rw")

    real = ledger.list_node

    async def pod_deleted_meanwhile(node: str) -> Any:
        await pods.on_event("DELETED", pod)  # the pod watcher's release reaches Redis first
        assert "h1" not in (await ledger.snapshots(["rw"]))["rw"].reservations
        return await real(node)

    ledger.list_node = pod_deleted_meanwhile  # type: ignore[method-assign]
    gone = gpu_node("rw", units=0, cards=0) if node_event == "MODIFIED" else gpu_node("rw")
    await nodes.on_event(node_event, gone)
    ledger.list_node = real  # type: ignore[method-assign]
    snap = (await ledger.snapshots(["rw"])).get("rw")
    assert snap is None or "h1" not in snap.reservations, f"the deleted pod is booked again: {snap}"
    assert snap is None or all(c.mem_used == c.cores_used == c.slices == 0 for c in snap.cards.values()), snap


async def test_a_holder_deleted_while_the_reconciler_repairs_its_node_is_not_booked_again(ledger: Ledger) -> None:
    """The same window in the reconciler's repair: the holders it writes are read before its Redis calls (the node
    watcher's lock, list_node, replace_node). A holder missing from the ledger is booked by the repair; its pod
    deleted meanwhile (released by the pod watcher: nothing was booked yet) was booked again, for nobody."""
    nodes, pods = await live_on(ledger, "rr")
    pod = bound_pod("h2", "rr", 0, 64 * 1024, 12)
    pods.learn("h2", pod)  # in the view, not in the ledger (its record's booking was lost): the repair books it
    reconciler = Reconciler(NoKube(), ledger, CFG, nodes, pods)  # type: ignore[arg-type]
    assert not reconciler.views_live()
    real = ledger.list_node

    async def pod_deleted_meanwhile(node: str) -> Any:
        await pods.on_event("DELETED", pod)
        return await real(node)

    ledger.list_node = pod_deleted_meanwhile  # type: ignore[method-assign]
    await reconciler.reconcile_all()
    ledger.list_node = real  # type: ignore[method-assign]
    assert "h2" in pods.ended
    snap = (await ledger.snapshots(["rr"]))["rr"]
    assert "h2" not in snap.reservations, f"the deleted pod is booked again: {snap}"
    assert all(c.mem_used == c.cores_used == c.slices == 0 for c in snap.cards.values()), snap


async def test_a_pod_deleted_while_its_deferred_record_is_confirmed_is_not_booked_again(ledger: Ledger) -> None:
    """The pod watcher holds back the record of our bind's own booking (the binder confirms it a moment later) and
    sends it to `observe` when it is due (confirm_due: its own loop, and the janitor's confirm_now), concurrently
    with the pod stream. The pod deleted while that observe was on its way was released first, and the observe then
    booked the deleted pod again, for nobody."""
    _nodes, pods = await live_on(ledger, "rd", units=160)
    assert (await ledger.reserve("rd", "h3", [0], 128, 12, 1, pod="ns/h3"))[0].ok  # our bind's booking, pending
    snap = await ledger.snapshot("rd")
    assert snap is not None
    pods.mirror.put(snap)
    pod = bound_pod("h3", "rd", 0, 64 * 1024, 12)
    await pods.on_event("MODIFIED", pod)  # its Binding committed; the binder died before its confirmation
    assert "h3" in pods.deferred
    real = ledger.observe

    async def pod_deleted_meanwhile(*args: Any, **kw: Any) -> Any:
        await pods.on_event("DELETED", pod)  # the release reaches Redis first
        assert "h3" not in (await ledger.snapshots(["rd"]))["rd"].reservations
        return await real(*args, **kw)

    ledger.observe = pod_deleted_meanwhile  # type: ignore[method-assign]
    await pods.confirm_due(now=float("inf"))
    ledger.observe = real  # type: ignore[method-assign]
    snap = (await ledger.snapshots(["rd"]))["rd"]
    assert "h3" not in snap.reservations, f"the deleted pod is booked again: {snap}"
    assert all(c.mem_used == c.cores_used == c.slices == 0 for c in snap.cards.values()), snap


async def test_a_pod_deleted_while_its_deferred_record_is_confirmed_never_over_commits_its_card(ledger: Ledger) -> None:
    """The same window, with the room taken meanwhile: the deleted pod's release frees its card, another pod's bind
    books it, and the held-back observe then lands. Its card must never hold more than it has, even for a moment
    (the janitor stress's "c card 1: cores_used 26 outside 0..16", with the watcher's "pod ... over-commits card(s)"
    for a pod of that run: a candidate cause). The release tombstones the uid (shared/domain/ended.py) and the
    observe then books nothing (observe.lua's `ended`)."""
    _nodes, pods = await live_on(ledger, "ro", units=160)
    assert (await ledger.reserve("ro", "h4", [0], 128, 12, 1, pod="ns/h4"))[0].ok  # our bind's booking, pending
    snap = await ledger.snapshot("ro")
    assert snap is not None
    pods.mirror.put(snap)
    pod = bound_pod("h4", "ro", 0, 64 * 1024, 12)
    await pods.on_event("MODIFIED", pod)  # its Binding committed; the binder died before its confirmation
    assert "h4" in pods.deferred
    real = ledger.observe
    seen: list[Any] = []

    async def pod_deleted_and_room_taken_meanwhile(*args: Any, **kw: Any) -> Any:
        await pods.on_event("DELETED", pod)  # the release reaches Redis first ...
        took = await ledger.reserve("ro", "other", [0], 128, 12, 1, pod="ns/other")  # ... another bind the room
        assert took[0].ok, took
        out = await real(*args, **kw)  # ... and then the observe
        seen.append((out, (await ledger.snapshots(["ro"]))["ro"]))
        return out

    ledger.observe = pod_deleted_and_room_taken_meanwhile  # type: ignore[method-assign]
    await pods.confirm_due(now=float("inf"))
    ledger.observe = real  # type: ignore[method-assign]
    out, during = seen[0]
    assert not out.get("overcommit") and not all_violations({"ro": during}), (out, during)


async def test_a_rebuild_from_a_list_read_before_a_pod_ended_books_it_nowhere(ledger: Ledger) -> None:
    """The rebuild's list is read before its writes: a pod the pod stream saw end since is left out of them, also
    where its tombstone went with its node (the Node deleted and registered again, another pod taking its room:
    tests/redis/test_redteam_tombstone.py, the ledger-level window)."""
    nodes = watcher(ledger)
    pods = pods_of(ledger, nodes, live=True)
    node = gpu_node("rl")
    await nodes.on_event("ADDED", node)
    pod = bound_pod("h3", "rl", 0, 16 * 1024, 12)
    await pods.on_event("ADDED", pod)
    reconciler = Reconciler(NoKube(), ledger, CFG, nodes, pods)  # type: ignore[arg-type]

    async def nodes_list() -> tuple[list[dict[str, Any]], str]:
        return [node], "1"

    async def pods_list() -> tuple[list[dict[str, Any]], str]:  # read before the pod ended
        listed = [pod]
        await pods.on_event("DELETED", pod)  # released, tombstoned
        assert await ledger.remove_node("rl") is True  # the Node deleted: its tombstones with it
        await ledger.replace_node(inventory("rl", S4000), {}, keep_ms=10_000)  # registered again: written new
        assert (await ledger.reserve("rl", "q", [0], S4000, 16, 1, pod="ns/q"))[0].ok  # another pod takes the room
        return listed, "2"

    real = ledger.rebuild
    written: list[Any] = []

    async def rebuild(*args: Any, **kwargs: Any) -> Any:  # the ledger as the rebuild's writes leave it
        out = await real(*args, **kwargs)
        written.append((await ledger.snapshots(["rl"]))["rl"])
        return out

    nodes.reflector.list = nodes_list  # type: ignore[method-assign]
    pods.reflector.list = pods_list  # type: ignore[method-assign]
    ledger.rebuild = rebuild  # type: ignore[method-assign]
    await reconciler.rebuild("redis")
    # (before the rebuild's "release again" after its writes, which gives h3 back in the end)
    assert "h3" not in written[0].reservations and not all_violations({"rl": written[0]}), written[0]
    snap = (await ledger.snapshots(["rl"]))["rl"]
    assert "h3" not in snap.reservations and not all_violations({"rl": snap}), snap
