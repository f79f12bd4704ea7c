"""A node that newly offers room (new, open again, a card healthy or uncordoned, more cards) nudges kube-scheduler
once the ledger has it. kube-scheduler retries pending pods at the Node's own event, which may reach an extender
before its mirror has our write of the node: a pod turned away then ("node unregistered") waited for an unrelated
event, up to kube-scheduler's 5-minute flush (seen in tests/e2e/test_topk.py on a loaded machine: the pinned pod's
only node unregistered in the extender's view, the pod never retried). Real redis-server."""

from __future__ import annotations

from typing import Any

import pytest

from controller.node_watch import NodeWatcher
from shared.config import Config
from shared.domain.node import CORDON_ANNOTATION, device_id
from shared.store.ledger import Ledger

pytestmark = pytest.mark.redis


class _Kube:
    """The watcher's API client: no call is expected (no held card, no mismatch)."""

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        raise AssertionError(f"unexpected {method} {path}")


def gpu(name: str, cards: int = 2, cordoned: tuple[int, ...] = (), **labels: str) -> dict[str, Any]:
    ann = {CORDON_ANNOTATION: ",".join(device_id(name, i) for i in cordoned)} if cordoned else {}
    return {"metadata": {"name": name, "uid": f"uid-{name}", "labels": labels, "annotations": ann},
            "status": {"capacity": {"mthreads.com/sgpu-core": str(16 * cards),
                                    "mthreads.com/sgpu-memory": str(96 * cards)}}}


async def test_room_a_node_gains_nudges_kube_scheduler(ledger: Ledger) -> None:
    watcher = NodeWatcher(_Kube(), ledger, Config())  # type: ignore[arg-type]
    nudged: list[str] = []
    watcher.nudge = nudged.append
    await watcher.on_sync([gpu("old")])
    assert nudged == []  # the first list: every node is new to this watcher, none was seen lagging
    await watcher.on_event("ADDED", gpu("n1"))
    assert nudged == ["n1"] and (await ledger.snapshots(["n1"]))["n1"] is not None  # after the ledger has it
    await watcher.on_event("MODIFIED", gpu("n1", team="a"))  # a label of no concern to the cards
    await watcher.on_event("MODIFIED", gpu("n1", cordoned=(1,)))  # less room
    assert nudged == ["n1"]
    await watcher.on_event("MODIFIED", gpu("n1"))  # the cordon lifted
    await watcher.on_event("MODIFIED", gpu("n1", cards=3))  # one more card
    assert nudged == ["n1", "n1", "n1"]
    await watcher.on_event("MODIFIED", gpu("n1", cards=0))  # no card reported
    await watcher.on_event("MODIFIED", gpu("n1", cards=2))  # back
    assert nudged == ["n1"] * 4
    await watcher.on_event("DELETED", gpu("n1"))
    assert nudged == ["n1"] * 4
    # a re-list after the watch was down: a node new since is nudged, one unchanged is not
    await watcher.on_sync([gpu("old"), gpu("n2")])
    assert nudged == ["n1"] * 4 + ["n2"]
