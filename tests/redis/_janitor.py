"""A janitor whose monotonic clock the test moves, over a mirror of one-card S4000 nodes (the red-team tests of
Redis's clock stepping: tests/redis/test_redteam_clock_forward.py, test_redteam_today_janitor.py)."""

from __future__ import annotations

import pytest

import controller.janitor as janitor_module
from controller.janitor import Janitor
from shared.config import Config
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis.helpers import S4000, inventory


async def clocked_janitor(ledger: Ledger, monkeypatch: pytest.MonkeyPatch, cfg: Config,
                          *nodes: str) -> tuple[Janitor, Mirror, list[float]]:
    """The nodes in the ledger, a mirror that has read them, and a janitor that has swept once (nothing to expire:
    it runs before the bind, as it does); its clock (controller/janitor.py's time.monotonic) is `clock[0]`."""
    clock = [5000.0]
    monkeypatch.setattr(janitor_module.time, "monotonic", lambda: clock[0])
    for node in nodes:
        await ledger.upsert_node(inventory(node, S4000, n=1))
    mirror = Mirror(ledger)
    await mirror.resync(full=True)
    janitor = Janitor(ledger, mirror, cfg)
    assert await janitor.sweep() == []
    return janitor, mirror, clock
