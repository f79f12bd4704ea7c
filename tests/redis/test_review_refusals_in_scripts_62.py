"""Redis 6.2 reports a refusal met inside a script in the script's error (review of rt-ready, 2026-12-07).

rt-ready made MISCONF transient (shared/serving/supervise.py REDIS_REFUSALS_THAT_END), "a script's and a plain
command's", tested on Redis 7, which answers a script's refused call with the refusal itself ("MISCONF ..."). Redis
6.2, the oldest release docs/install.md names, runs EVAL (not a write command there) and refuses the write inside it:
"Error running script (call to f_<sha>): @user_script:404: @user_script: 404: -MISCONF ...", a plain ResponseError
that is_transient took for a bug. So on 6.2 the janitor's, the reconciler's and the extender's scripts failing five
times in a row under MISCONF still made the role give up and crash-loop (shared/serving/supervise.py _guard), the
very fault rt-ready meant to cure; OOM (full under noeviction) and READONLY (a replica) met in a script alike, though
their plain forms were transient. Real redis-server 6.2 (deploy/local/redis62.py), real refusals."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from deploy.local.redis import RedisServer, new_password
from deploy.local.redis62 import redis62_binary
from shared.config import load_config
from shared.serving.supervise import Supervisor, is_transient
from shared.store.ledger import Ledger, LedgerError
from shared.store.session import open_ledger
from tests.redis.helpers import S4000, inventory
from tests.redis.test_redteam_ready_misconf import _cannot_save

pytestmark = pytest.mark.redis


@pytest.fixture
async def on62() -> AsyncIterator[tuple[RedisServer, Ledger]]:
    server = RedisServer(binary=str(redis62_binary()), password=new_password()).start()
    sup = Supervisor()
    ledger, mirror = await asyncio.wait_for(open_ledger(load_config(env={}, flags={"redisUrl": server.url}), sup), 10)
    try:
        assert (await ledger.redis.info("server"))["redis_version"].startswith("6.2.")
        await ledger.upsert_node(inventory("n1", S4000))
        yield server, ledger
    finally:
        await sup.cancel()
        await ledger.redis.aclose()
        await mirror.subscriber.aclose()
        server.cleanup()


async def _refused_script(ledger: Ledger, code: str) -> LedgerError:
    with pytest.raises(LedgerError, match=f"-{code} ") as refused:
        await ledger.reserve("n1", "u1", [0], 8, 2, 1, pod="ns/p1")  # (the janitor's and reconciler's alike)
    return refused.value


async def test_a_scripts_misconf_on_redis_62_is_transient(on62: tuple[RedisServer, Ledger]) -> None:
    server, ledger = on62
    cure = _cannot_save(server)
    try:
        e = await _refused_script(ledger, "MISCONF")
        assert is_transient(e), f"a task failing so five times exits the role: {e!r}"
    finally:
        cure()
    await ledger.reserve("n1", "u1", [0], 8, 2, 1, pod="ns/p1")  # and it books once Redis saves again


async def test_a_scripts_oom_and_readonly_on_redis_62_are_transient(on62: tuple[RedisServer, Ledger]) -> None:
    _, ledger = on62
    for refusal, setup, undo in (("OOM", ("config", "set", "maxmemory", "1"), ("config", "set", "maxmemory", "0")),
                                 ("READONLY", ("replicaof", "127.0.0.1", "1"), ("replicaof", "no", "one"))):
        await ledger.redis.execute_command(*setup)
        try:
            e = await _refused_script(ledger, refusal)
            assert is_transient(e), f"a task failing so five times exits the role: {e!r}"
        finally:
            await ledger.redis.execute_command(*undo)


def test_a_scripts_own_error_stays_what_it_was() -> None:
    from redis.exceptions import ResponseError

    # a script's bug (a Lua runtime error) or a refusal that does not end by itself is no transient failure
    for message in ("Error running script (call to f_0a): @user_script:3: user_script:3: attempt to index a nil value",
                    "Error running script (call to f_0a): @user_script:3: @user_script: 3: -WRONGTYPE Operation "
                    "against a key holding the wrong kind of value",
                    "BADINPUT reserve: cards must be a list"):
        e = LedgerError(f"reserve on n1: {message}")
        e.__cause__ = ResponseError(message)
        assert not is_transient(e), message
