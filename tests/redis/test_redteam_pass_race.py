"""Red team: a reconcile pass overwrites a Node change the node watcher applied during it.

f7894d6 made `Reconciler.rebuild` hold `NodeWatcher.lock`, so a Node event during a rebuild is applied after it
instead of being overwritten by the rebuild's older list. The periodic pass (`Reconciler._pass`) has the same
shape and takes no lock: it takes the watchers' view (`_views`: `nodes.last`) before it walks the nodes, awaits
the API server for every suspect booking (`_confirm`: one GET per pod), and then repairs the node with
`replace_node(inv)` from that older view. A Node change the node watcher applied meanwhile (here a card cordoned
with `hami.io/device-cordon`) is overwritten in Redis, while `nodes.last` holds the newer copy: the cordoned
card is offered (and booked) until the next pass repairs it back, reconcileSeconds (30 s) later -- or longer on
a large fleet where a pass reaches a node seconds after its view was taken.

Expected: the repair writes the node as the watcher holds it when the repair is sent (re-read
`self.nodes.last` / `effective` after the awaits), or the pass's repair of a node runs under
`NodeWatcher.lock`. Fix: controller/reconciler.py `reconcile_node` / `_pass`.

Real parts: redis-server, Ledger, Mirror, NodeWatcher, PodWatcher, Reconciler
(tests/redis/test_redteam_rebuild_race.py).
"""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis

from shared.kube import KubeError
from shared.store.ledger import Ledger
from tests.redis.test_redteam_inflight_nodes import age, gpu_node
from tests.redis.test_redteam_rebuild_race import Api, annotated, card, role

pytestmark = pytest.mark.redis


class SlowApi(Api):
    """The pass's GET of a suspect's pod: while it is in flight, the node watcher handles `during_get`."""

    def __init__(self, nodes: list[dict[str, Any]]):
        super().__init__(nodes)
        self.during_get: Any = None

    async def get_pod(self, ns: str, name: str) -> Any:
        if self.during_get is not None:
            hook, self.during_get = self.during_get, None
            await hook()
        raise KubeError(404, {"message": "not found"}, "get pod")


async def test_redteam_a_card_cordoned_during_a_reconcile_pass_stays_cordoned(ledger: Ledger,
                                                                              redis_client: Redis) -> None:
    api = SlowApi([gpu_node("n")])
    nodes, _pods, rec = await role(ledger, api)
    await rec.rebuild("start")
    # a booking no live pod explains (its pod is gone): the pass will ask the API server about it, then repair n
    assert (await ledger.reserve("n", "ghost", [1], 8, 2, 1, pod="ns/ghost"))[0].ok
    assert await ledger.mark_bound("n", "ghost")
    await age(redis_client, ledger, "n", "ghost", 60_000)

    cordoned = annotated("n", {"hami.io/device-cordon": "n-mthreads-0"})

    async def cordon() -> None:
        await nodes.on_event("MODIFIED", cordoned)  # the node watcher's event, handled while the pass waits
        assert await card(ledger, "n", 0) == ("cordoned", 16)

    api.during_get = cordon
    await rec.reconcile_all()
    assert api.during_get is None, "the pass asked the API server about the ghost booking"
    assert await card(ledger, "n", 0) == ("cordoned", 16), (
        "card 0 was cordoned on the Node (and written by the node watcher) while a reconcile pass asked the API "
        f"server about a stale booking; the pass's repair wrote its older view: card 0 is {await card(ledger, 'n', 0)}"
        " in Redis, offered until the next pass")
