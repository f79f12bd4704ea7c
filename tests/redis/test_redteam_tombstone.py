"""Red team on the ended pods' tombstones (shared/domain/ended.py, `<prefix>:{<node>}:ended`): every caller of
Ledger.observe must read its `ended` answer (nothing booked) as such.

Real parts: redis-server, the product's Ledger and the extender's Confirmations."""

from __future__ import annotations

from typing import Any

import pytest

from controller.confirm import Confirmations
from shared.domain.request import ContainerShare, Mode, SliceRequest
from shared.serving.metrics import REBOOKED
from shared.store.ledger import Ledger
from tests.redis.helpers import S5000, inventory

pytestmark = pytest.mark.redis


async def test_rt_a_bind_whose_pod_ended_before_its_rebook_is_not_counted_as_booked_again(
        ledger: Ledger, caplog: pytest.LogCaptureFixture) -> None:
    """The extender's confirmation finds the booking gone (mark_bound's `missing`) and reads the pod still there
    (or cannot read it: counted as here); the pod is deleted meanwhile and the pod watcher's release tombstones it.
    Its observe answers `ended`, nothing booked: the bind must not count a rebook nor log that it booked it."""
    await ledger.upsert_node(inventory("rc", S5000))
    assert await ledger.release("rc", "t1", ended=True) is False  # the pod watcher's release came first

    async def pod_here(ns: str, name: str, uid: str, node: str) -> dict[str, Any] | None:
        return {"metadata": {"name": name, "namespace": ns, "uid": uid}, "spec": {"nodeName": node},
                "status": {"phase": "Running"}}  # read a moment before the deletion

    confirms = Confirmations(ledger, pod_here)
    req = SliceRequest(Mode.SLICE, 1, 32, 8, 1, None, (ContainerShare("c", False, 32, 8),))
    before = REBOOKED._value.get()
    with caplog.at_level("INFO", logger="mtsched.extender"):
        await confirms._rebook("rc", "t1", "ns/t1", req, (0,), S5000)
    assert "t1" not in (await ledger.snapshots(["rc"]))["rc"].reservations
    assert REBOOKED._value.get() == before, "an observe answered `ended` (nothing booked) counted as booked again"
    assert not [r for r in caplog.records if "booked again from its record" in r.getMessage()], caplog.text
