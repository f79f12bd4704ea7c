"""Red team: the node list (`<prefix>:nodes`) of another type is deleted by the role that meets WRONGTYPE on it
(Ledger._cleared_node_list), and read as empty until the watchers list the nodes again. The delete was a plain DEL sent
after the WRONGTYPE, so a role whose delete came late (two roles met the damage at once, one's round trip slow) deleted
the set another role had already cleared and filled again: the nodes listed meanwhile were unlisted, every mirror
dropped them (offered nothing) until a reconciler pass listed them again. Now the delete is of a key of another type
only, checked in the same step (a script).

Real parts: redis-server, two of the product's Ledgers (two roles)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from redis import exceptions as rexc
from redis.asyncio import Redis

from shared.store.ledger import Ledger

pytestmark = pytest.mark.redis
T = TypeVar("T")


async def test_a_late_clear_of_a_damaged_node_list_does_not_unlist_the_nodes_listed_since(
        ledger: Ledger, redis_client: Redis) -> None:
    other = Ledger(redis_client)  # another role, on its own client
    await other.load_scripts()
    await redis_client.set(ledger.nodes_key, "not a set")
    real = ledger._retry

    async def slow(what: str, op: Callable[[], Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        try:
            return await real(what, op, *args, **kwargs)
        except rexc.ResponseError:
            if what == "smembers":  # between this role's WRONGTYPE and its delete: the other role clears and lists
                assert await other.nodes() == []
                assert await other.list_node("n1") == 1
            raise

    ledger._retry = slow  # type: ignore[method-assign]
    assert await ledger.nodes() in ([], ["n1"])
    members = await redis_client.smembers(ledger.nodes_key)  # type: ignore[misc]
    assert members == {"n1"}, "the node the other role listed after clearing the damage was unlisted by a late DEL"
