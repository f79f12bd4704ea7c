"""Red team of the Nudger's cluster-wide mode (controller/nudger.py `_patch_any`, shared/domain/nudge.py).

Each test below failed on bc6b71b and shows an ask for a live Node that never got a first patch (a lost wake). (A
third, an API server emulating an older version read as its binary, went with the rule: the mode is now derived
from the kube-scheduler's own version, not the API server's.)"""

from __future__ import annotations

import asyncio
from typing import Any

from controller.nudger import RECENT_NODES, Nudger
from shared.kube import KubeError
from tests.unit.test_nudger import Patches, settled


def cluster_wide(kube: Any, interval: float = 0.02, follow_up: float = 0.05) -> Nudger:
    n = Nudger(kube, interval=interval, follow_up=follow_up)
    n.cluster_wide = True
    return n


class Gone(Patches):
    """Nodes in `gone` answer 404; a PATCH of `hold` waits for `release` (once)."""

    def __init__(self, gone: set[str], hold: str = "") -> None:
        super().__init__()
        self.gone, self.hold = gone, hold
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def request(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        node = path.rsplit("/", 1)[1]
        if node == self.hold:
            self.hold = ""
            self.started.set()
            await self.release.wait()
            return await super().request(method, path, body, **kw)  # admitted before the Node went
        if node in self.gone:
            raise KubeError(404, "not found", path)
        return await super().request(method, path, body, **kw)


async def test_redteam_a_live_node_asked_before_a_scale_down_is_not_patched() -> None:
    """A release on a live Node, then releases of the pods of RECENT_NODES Nodes a scale-down deleted (pod GC
    deletes their pods at once), all within one interval: the live Node is evicted from `_recent`, the first patch
    tries the eight gone Nodes (eight 404s) and patches nothing, and no follow-up goes. Per-node mode patches
    the live Node twice."""
    gone = {f"gone{i}" for i in range(RECENT_NODES)}
    kube = Gone(gone)
    n = cluster_wide(kube)
    n.known_nodes = lambda: ["live"]  # the node watcher's view (controller/watchers.py wire): the gone ones left it
    n.nudge("live")
    for node in sorted(gone):
        n.nudge(node)
    await settled(n)
    assert kube.sent, ("the live node's release woke nobody", n.outcomes)


async def test_redteam_an_ask_during_the_first_patch_is_dropped_from_the_candidates() -> None:
    """`_patch_any` replaces `_recent` with {the patched node} after its await: a Node asked while that PATCH was
    in flight is forgotten. If the patched Node is then deleted, the ask's own first patch finds no candidate
    but the gone one, and nothing is sent after it (the follow-up goes to the gone Node too)."""
    kube = Gone(set(), hold="x")
    n = cluster_wide(kube)
    n.nudge("x")
    await kube.started.wait()  # x's first patch in flight
    n.nudge("y")  # y gained room: it needs a patch at least `interval` after now
    assert "y" in n._recent
    kube.gone.add("x")  # x is deleted (its PATCH had already been admitted)
    kube.release.set()
    await settled(n)
    assert kube.sent[1:], ("no patch after y's ask", kube.sent, n.outcomes)
