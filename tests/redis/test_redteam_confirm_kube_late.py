"""Red team on the refactor of 9cdee46 (controller/confirm.py): Confirmations takes `pod_here` once, when the Extender
is built. Before, Extender._still_here read `self.kube` at call time; an Extender built without an API client and
given one afterwards (as several tests do with `ext.kube = ...`) now rebooks a booking whose pod is gone."""

from __future__ import annotations

from controller.extender import Extender
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis.test_extender_bind import FakeKube


async def test_rt_still_here_follows_the_extenders_api_client(ledger: Ledger) -> None:
    from tests.redis.test_extender_bind import CFG

    ext = Extender(CFG, ledger, Mirror(ledger), None)
    ext.kube = FakeKube()  # type: ignore[assignment]  # no pod ns/p-gone: a 404
    assert await ext._bound_here("ns", "p-gone", "u", "s5k") is None  # the extender itself sees it gone
    assert not await ext.confirms._still_here("ns/p-gone", "u", "s5k"), "a deleted pod counted as still here"
