"""Red team (session): every Redis URL form now gives up on a reply after SOCKET_TIMEOUT (5 s), and the ledger sends
the script again. Every script is idempotent by pod uid, so nothing is booked or released twice, but a release's or
an expiry's second run finds nothing held and answers so: the watcher that released a deleted pod's share (or the
janitor that expired a dead binder's booking) then nudged no node, and the pods kube-scheduler had turned away for
that card waited for its next unschedulable flush (minutes) with the card free. A send that may have run (a timeout,
a lost connection) now counts as having released what is no longer held.

Real parts: redis-server, the Ledger, Mirror and PodWatcher; the script's reply is lost after it ran."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis import exceptions as rexc

from controller.pod_watch import PodWatcher
from shared.config import load_config
from shared.store.ledger import Ledger
from tests._wait import eventually
from tests.redis.conftest import MirrorFactory
from tests.redis.helpers import S4000, inventory
from tests.redis.test_redteam_release_hint import Nudges, ended

pytestmark = pytest.mark.redis
CFG = load_config(env={}, flags={"memoryPerCard": "96,160"})


def lose_first_reply(ledger: Ledger, name: str) -> list[str]:
    """The next run of script `name` takes effect, and its reply times out (as redis-py reports it)."""
    real = ledger._scripts[name]
    lost: list[str] = []

    async def run(keys: Any = None, args: Any = None, client: Any = None) -> Any:
        out = await real(keys, args)
        if not lost:
            lost.append(name)
            raise rexc.TimeoutError("Timeout reading from socket")
        return out

    ledger._scripts[name] = run  # type: ignore[assignment]
    return lost


async def test_a_release_whose_reply_is_lost_still_nudges_the_node(ledger: Ledger,
                                                                   mirror_factory: MirrorFactory) -> None:
    await ledger.upsert_node(inventory("a", S4000))
    assert (await ledger.reserve("a", "p", [0], 96, 16, 1, pod="ns/p"))[0].ok
    assert await ledger.mark_bound("a", "p")
    mirror = await mirror_factory()
    pods = PodWatcher(Nudges(), ledger, mirror, CFG, asyncio.Event())  # type: ignore[arg-type]
    nudged: list[str] = []
    pods.nudger.nudge = nudged.append  # type: ignore[method-assign,assignment]
    lost = lose_first_reply(ledger, "release")
    await pods.release("p", ended("p", "a"), "succeeded")
    assert lost
    assert "p" not in (await ledger.snapshots(["a"]))["a"].reservations
    assert nudged == ["a"]


async def test_an_expiry_whose_reply_is_lost_answers_what_it_released(ledger: Ledger) -> None:
    await ledger.upsert_node(inventory("a", S4000))
    assert (await ledger.reserve("a", "p", [0], 96, 16, 1, pod="ns/p"))[0].ok
    await ledger.redis.hset(ledger.keys.res("a", "p"), "created", "1")  # type: ignore[misc]
    lost = lose_first_reply(ledger, "expire")
    gone = await ledger.expire("a", 30, only=["p"])
    assert lost
    assert "p" not in (await ledger.snapshots(["a"]))["a"].reservations
    assert gone == ["p"]  # what the janitor nudges the node for


@pytest.mark.parametrize("lose", [False, True])
async def test_a_rebuild_whose_replace_reply_is_lost_still_nudges_the_node(ledger: Ledger, lose: bool) -> None:
    """A rebuild drops bookings no live pod explains and nudges kube-scheduler about their nodes (`freed`); the
    replace's reply lost after it ran, its second run found nothing to drop and nudged nothing (left open in the
    eighth session's note): the pods turned away for those cards waited for kube-scheduler's flush, minutes."""
    inv = inventory("a", S4000)
    await ledger.upsert_node(inv)
    assert (await ledger.reserve("a", "gone", [0], 96, 16, 1, pod="ns/gone"))[0].ok
    assert await ledger.mark_bound("a", "gone")  # its pod went while no watcher ran: no live pod explains it
    bound_at = (await ledger.snapshots(["a"]))["a"].reservations["gone"].bound_at

    async def later() -> bool:  # (a booking bound in the last keep_ms, here 0 ms, is kept)
        secs, micros = await ledger.redis.time()
        return secs * 1000 + micros // 1000 > bound_at
    await eventually(later, within=5, what="Redis's clock past the binding")
    lost = lose_first_reply(ledger, "replace_node") if lose else []
    freed: list[str] = []
    stats = await ledger.rebuild([inv], {}, keep_ms=0, freed=freed.append)
    assert bool(lost) == lose
    assert "gone" not in (await ledger.snapshots(["a"]))["a"].reservations
    assert stats["dropped"] == (0 if lose else 1)  # (the second run found it dropped)
    assert freed == ["a"]
