"""Red team on the ended pods' tombstones (shared/domain/ended.py, `<prefix>:{<node>}:ended`): every caller of
Ledger.observe must read its `ended` answer (nothing booked) as such; a write read before a pod ended must not book
it over a pod that took its room, also when its node went from Redis and came back meanwhile.

Real parts: redis-server, the product's Ledger and the extender's Confirmations."""

from __future__ import annotations

from typing import Any

import pytest

from controller.confirm import Confirmations
from shared.domain.annotations import PodUsage
from shared.domain.request import ContainerShare, Mode, SliceRequest
from shared.serving.metrics import REBOOKED
from shared.store.ledger import Ledger
from tests.redis.helpers import S5000, all_violations, inventory

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


@pytest.mark.xfail(strict=True, reason="remove_node deletes the node's tombstones (remove_node.lua): a node removed "
                                       "and written anew within a write's window loses them, and a rebuild from a "
                                       "list read before the pod ended books it over the pod that took its room "
                                       "until the rebuild's release-again belt, after every node is written. The "
                                       "reconciler leaves out of its rebuild every pod the pod stream saw end "
                                       "(tests/redis/test_node_write_release_race.py), so only a pod that ends "
                                       "while the rebuild writes, its node removed and back meanwhile, remains")
async def test_rt_a_node_removed_and_back_keeps_its_tombstones_from_a_rebuild_read_before(ledger: Ledger) -> None:
    """A Node deleted from the API: the pod GC deletes its pods (the pod watcher's release tombstones P), the node
    watcher removes the node (nothing held), kubelet registers it again (written anew) and another pod's bind takes
    P's room. A rebuild whose list was read before all this writes the node with P: the tombstones went with the
    node, so P is booked again over Q."""
    usage = PodUsage("rn", (0,), 128, 12, 1)
    await ledger.upsert_node(inventory("rn", S5000))
    assert (await ledger.observe("p", usage, "ns/p"))["changed"]  # P bound; the rebuild's list reads it here
    assert await ledger.release("rn", "p", ended=True)  # P deleted (pod GC): tombstoned
    assert await ledger.remove_node("rn") is True  # the Node deleted, nothing held there: removed
    await ledger.replace_node(inventory("rn", S5000), {}, keep_ms=10_000)  # registered again: written new
    assert (await ledger.reserve("rn", "q", [0], 128, 12, 1, pod="ns/q"))[0].ok  # Q takes P's room
    await ledger.rebuild([inventory("rn", S5000)], {"p": (usage, "ns/p")}, keep_ms=10_000)
    snap = (await ledger.snapshots(["rn"]))["rn"]
    assert "p" not in snap.reservations and not all_violations({"rn": snap}), snap


async def test_rt_the_tombstones_of_a_burst_long_past_are_trimmed(ledger: Ledger) -> None:
    """docs/redis-layout.md: "the hash holds about twice the last ten minutes' tombstones at most". A node that saw a
    burst of 2,000 ended pods (a trim within it kept 1,000: `#trim_at` 2,000), quiet since for an hour: its next
    tombstones must not leave the burst's 2,000 stale ones in the hash (a trim came only when `#n` reached `#trim_at`:
twice the burst's, stale, until as many new ones came)."""
    from shared.domain.ended import ENDED_KEEP_MS, ENDED_TRIM_FLOOR

    await ledger.upsert_node(inventory("rb", S5000))
    key = ledger.keys.ended("rb")
    now = await ledger.redis_time_ms()
    old = now - 6 * ENDED_KEEP_MS  # an hour ago
    await ledger.redis.hset(key, mapping={**{f"burst{i}": old for i in range(2000)},  # type: ignore[misc]
                                          "#n": 1000, "#trim_at": 2000})
    for i in range(ENDED_TRIM_FLOOR):  # a few ended pods an hour later (the floor's worth)
        assert await ledger.release("rb", f"late{i}", ended=True) is False
    fields = [f for f in await ledger.redis.hkeys(key) if not f.startswith("#")]  # type: ignore[misc]
    assert len(fields) <= 2 * ENDED_TRIM_FLOOR, f"{len(fields)} tombstones kept"


async def test_rt_every_script_declares_the_tombstones_it_touches(redis_client: Any) -> None:
    """Redis Cluster requires every key in KEYS: the tombstone paths (release with `ended`, held or not, with a trim
    due; observe and replace_node of a tombstoned uid; remove_node with tombstones) under the strict prelude of
    tests/redis/test_script_keys.py, from ledgers that know nothing of the node."""
    from shared.domain.ended import ENDED_TRIM_FLOOR
    from tests.redis.test_script_keys import StrictLedger

    def cold() -> StrictLedger:
        return StrictLedger(redis_client)

    usage = PodUsage("rs", (0,), 8, 2, 1)
    assert await cold().upsert_node(inventory("rs", S5000)) == 1
    assert (await cold().observe("held", usage, "ns/held"))["changed"]
    assert await cold().release("rs", "held", ended=True)  # held: tombstoned with its release
    for i in range(ENDED_TRIM_FLOOR):  # held by nothing: tombstoned, and a trim comes
        assert await cold().release("rs", f"t{i}", ended=True) is False
    assert (await cold().observe("held", usage, "ns/held", keep_bound=True)).get("ended")
    out = await cold().replace_node(inventory("rs", S5000), {"held": (usage, "ns/held")}, 10_000, keep_bound=True)
    assert out["ended"] == ["held"], out
    assert await cold().remove_node("rs") is True
    assert not await redis_client.exists(Ledger(redis_client).keys.ended("rs"))
