"""Red team (migrating a live cluster from HAMi v2.10): pods HAMi's scheduler placed keep running with the records
HAMi's encoder wrote (its Filter patch: the allocation record, `mthreads.com/gpu-index`, `predicate-*`,
`hami.io/vgpu-node`/`-time`; its Bind: `hami.io/bind-phase: allocating`). When the watchers start on such a
cluster, every card those pods hold must be booked before any card is offered, whichever scheduler name mtsched
runs under, and a pod HAMi left mid-bind (filtered, record written, not bound) books nothing."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from controller.node_watch import NodeWatcher
from controller.pod_watch import PodWatcher
from controller.watchers import wire
from shared.config import Config, load_config
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror

pytestmark = pytest.mark.redis
CORE, MEM, VGPU = "mthreads.com/sgpu-core", "mthreads.com/sgpu-memory", "mthreads.com/vgpu"


class NoKube:
    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        raise AssertionError(f"unexpected {method} {path}")


def s4000_node(name: str, cards: int = 4) -> dict[str, Any]:
    cap = {CORE: str(16 * cards), MEM: str(96 * cards)}
    return {"metadata": {"name": name}, "status": {"capacity": cap, "allocatable": cap}}


def hami_pod(uid: str, limits: dict[str, str], record: str | None, index: str, *, node: str = "g1",
             bound: bool = True, scheduler: str = "hami-scheduler") -> dict[str, Any]:
    """A pod as HAMi v2.10 leaves it: its webhook's limits, its Filter's and Bind's annotations."""
    ann = {"hami.io/vgpu-node": node, "hami.io/vgpu-time": "1764979200", "hami.io/bind-phase": "allocating",
           "hami.io/bind-time": "1764979200", "mthreads.com/predicate-node": node,
           "mthreads.com/predicate-time": "1764979200000000000"}
    if record is not None:
        ann["hami.io/mthreads-vgpu-devices-allocated"] = record
        ann["mthreads.com/gpu-index"] = index
    spec: dict[str, Any] = {"schedulerName": scheduler,
                            "containers": [{"name": "c", "resources": {"limits": limits}}]}
    if bound:
        spec["nodeName"] = node
    return {"metadata": {"name": uid, "namespace": "ns", "uid": uid, "annotations": ann,
                         "labels": {"hami.io/vgpu-node": node}},
            "spec": spec, "status": {"phase": "Running" if bound else "Pending"}}


# what HAMi v2.10 writes (EncodePodSingleDevice) for its three documented pod shapes (examples/mthreads)
SLICE = ({VGPU: "1", MEM: "32", CORE: "8"}, "g1-mthreads-3,Mthreads,16384,8:;", "3")
EXCLUSIVE = ({VGPU: "1", MEM: "96", CORE: "16"}, "g1-mthreads-2,Mthreads,49152,16:;", "2")
MULTI = ({VGPU: "2", MEM: "192", CORE: "32"}, "g1-mthreads-1,Mthreads,49152,16:g1-mthreads-0,Mthreads,49152,16:;",
         "1,0")


async def start(ledger: Ledger, cfg: Config, pods: list[dict[str, Any]], node: dict[str, Any]) -> PodWatcher:
    nw = NodeWatcher(NoKube(), ledger, cfg, keep_ms=10_000)  # type: ignore[arg-type]
    pw = PodWatcher(NoKube(), ledger, Mirror(ledger), cfg, nw.lost)  # type: ignore[arg-type]
    wire(nw, pw)
    pw.reflector.synced.set()
    await pw.on_sync(pods)
    await nw.on_sync([node])
    return pw


def used(snap: Any) -> dict[int, tuple[int, int, int]]:
    return {i: (c.mem_used, c.cores_used, c.slices) for i, c in snap.cards.items()}


@pytest.mark.parametrize("name", ["hami-scheduler", "mtsched"])
async def test_hamis_running_pods_are_booked_before_any_card_is_offered(ledger: Ledger, name: str) -> None:
    cfg = load_config(env={}, flags={"schedulerName": name}) if name != "hami-scheduler" else load_config(env={})
    pods = [hami_pod("s", *SLICE[:2], SLICE[2]), hami_pod("x", *EXCLUSIVE[:2], EXCLUSIVE[2]),
            hami_pod("m", *MULTI[:2], MULTI[2])]
    await start(ledger, cfg, pods, s4000_node("g1"))
    snap = (await ledger.snapshots(["g1"]))["g1"]
    assert snap.error == ""
    assert used(snap) == {0: (96, 16, 1), 1: (96, 16, 1), 2: (96, 16, 1), 3: (32, 8, 1)}, used(snap)
    assert set(snap.reservations) == {"s", "x", "m"}


async def test_a_foreign_hami_record_is_not_said_to_book_nothing_when_its_cards_are_booked(
        ledger: Ledger, caplog: pytest.LogCaptureFixture) -> None:
    """Installed under another schedulerName, HAMi's pods are foreign (shared/domain/trust.py): their records are
    not booked as written, but what they hold is, from mthreads.com/gpu-index and their request. The watcher's
    error line said "nothing is booked for it": an operator reading it would think the cards free (and the
    MtschedRecordMismatch runbook sends them hunting a forger)."""
    cfg = load_config(env={}, flags={"schedulerName": "mtsched"})
    caplog.set_level(logging.ERROR, logger="mtsched")
    await start(ledger, cfg, [hami_pod("s", *SLICE[:2], SLICE[2])], s4000_node("g1"))
    snap = (await ledger.snapshots(["g1"]))["g1"]
    assert used(snap)[3] == (32, 8, 1)  # booked
    lines = [r.getMessage() for r in caplog.records if "ns/s" in r.getMessage()]
    assert lines and all("nothing is booked" not in m for m in lines), lines
    assert all("mthreads.com/gpu-index" in m for m in lines), lines


async def test_a_pod_hami_left_mid_bind_books_nothing(ledger: Ledger) -> None:
    """HAMi's Filter writes the record before its Bind: a pod it filtered but never bound (HAMi uninstalled between,
    or its Binding failed after `bind-phase: allocating`) runs nowhere. Its record names a card it does not hold:
    nothing is booked, and our bind writes a record of its own with the Binding when it places the pod."""
    cfg = load_config(env={})
    await start(ledger, cfg, [hami_pod("p", *EXCLUSIVE[:2], EXCLUSIVE[2], bound=False)], s4000_node("g1"))
    snap = (await ledger.snapshots(["g1"]))["g1"]
    assert snap.error == "" and snap.reservations == {} and all(u == (0, 0, 0) for u in used(snap).values())


@pytest.mark.parametrize(("name", "closed"), [("hami-scheduler", False), ("mtsched", True)])
async def test_a_hami_slice_our_webhook_would_refuse_is_booked_from_its_record_or_closes_its_node(
        ledger: Ledger, name: str, closed: bool) -> None:
    """HAMi admitted `sgpu-core: 0` (no range check); our request reader refuses it. Under HAMi's schedulerName its
    record is booked as written; under another one nothing on the pod tells what it holds: the node offers no card
    until it ends (fail closed), which the migration section of docs/install.md says to avoid."""
    cfg = load_config(env={}, flags={"schedulerName": name}) if name != "hami-scheduler" else load_config(env={})
    p = hami_pod("z", {VGPU: "1", MEM: "4", CORE: "0"}, "g1-mthreads-1,Mthreads,2048,0:;", "1")
    pw = await start(ledger, cfg, [p], s4000_node("g1"))
    snap = (await ledger.snapshots(["g1"]))["g1"]
    if closed:
        assert snap.error.startswith("quarantined: ns/z"), snap.error
        assert pw.quarantine("g1")
    else:
        assert snap.error == "" and used(snap)[1] == (4, 0, 1)


async def test_a_hami_record_our_decoder_refuses_closes_its_node(ledger: Ledger) -> None:
    """A pod HAMi's webhook never saw (failurePolicy Ignore while it was down, a namespace labelled
    hami.io/webhook=ignore) with `vgpu: 2, sgpu-memory: 3`: HAMi's Filter books 3 x 512 / 2 = 768 MiB a card, which
    is no whole unit. Our decoder refuses the record and the request is no multi-card request we can read: the node
    offers no card until the pod ends (fail closed), its name in the node's error."""
    p = hami_pod("o", {VGPU: "2", MEM: "3", CORE: "2"},
                 "g1-mthreads-1,Mthreads,768,1:g1-mthreads-0,Mthreads,768,1:;", "1,0")
    await start(ledger, load_config(env={}), [p], s4000_node("g1"))
    snap = (await ledger.snapshots(["g1"]))["g1"]
    assert snap.error.startswith("quarantined: ns/o"), snap.error


async def test_a_hami_pod_whose_init_container_holds_another_card_books_both(ledger: Ledger) -> None:
    """HAMi v2.10 places a pod's init containers and its app containers in two separate passes (scoreNode:
    allocateInitContainers, then allocateAppContainers on a fresh copy of the node), and its one-card rule
    (customFilterRule) only compares containers of the same pass: an init container may hold another card than
    the app containers, e.g. when the least loaded card lacks room for the larger of them. A sidecar (restartPolicy
    Always) holds it for the pod's life. Its record names both cards with different amounts; the decoder refused
    it, and the usage recovered from `mthreads.com/gpu-index` (the last container's card only) left the sidecar's
    card free under it: a new pod could be placed over the 32 units it holds."""
    sidecar = {"name": "proxy", "restartPolicy": "Always",
               "resources": {"limits": {VGPU: "1", MEM: "32", CORE: "4"}}}
    p = hami_pod("sc", {VGPU: "1", MEM: "16", CORE: "2"},
                 "g1-mthreads-0,Mthreads,16384,4:;g1-mthreads-1,Mthreads,8192,2:;", "1")
    p["spec"]["initContainers"] = [sidecar]
    await start(ledger, load_config(env={}), [p], s4000_node("g1", cards=2))
    snap = (await ledger.snapshots(["g1"]))["g1"]
    got = used(snap)
    assert got[0][0] >= 32 and got[0][1] >= 4, got  # the sidecar's card: what it holds is booked
    assert got[1][0] >= 16 and got[1][1] >= 2, got  # the app's card


async def test_under_another_name_a_hami_record_naming_cards_gpu_index_lacks_closes_its_node(ledger: Ledger) -> None:
    """The same HAMi pod (sidecar on card 0, app on card 1) under another schedulerName: its record is foreign and
    its usage is recovered from `mthreads.com/gpu-index`, which names the app's card only. What the sidecar holds
    cannot be told from that: the node must offer no card (it offered card 0 free under the sidecar's 32 units)."""
    sidecar = {"name": "proxy", "restartPolicy": "Always",
               "resources": {"limits": {VGPU: "1", MEM: "32", CORE: "4"}}}
    p = hami_pod("sc", {VGPU: "1", MEM: "16", CORE: "2"},
                 "g1-mthreads-0,Mthreads,16384,4:;g1-mthreads-1,Mthreads,8192,2:;", "1")
    p["spec"]["initContainers"] = [sidecar]
    pw = await start(ledger, load_config(env={}, flags={"schedulerName": "mtsched"}), [p],
                     s4000_node("g1", cards=2))
    snap = (await ledger.snapshots(["g1"]))["g1"]
    assert snap.error.startswith("quarantined: ns/sc"), (snap.error, used(snap))
    assert pw.quarantine("g1")
