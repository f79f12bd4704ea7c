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

from controller.watchers import PodWatcher
from shared.config import load_config
from shared.store.ledger import Ledger
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
