"""Fixtures shared by all suites: a real redis-server (started here, never mocked)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis

from deploy.local.redis import RedisServer, new_password
from shared.store.ledger import Ledger

# a timed-out test's task ends, its alarm repeated until it does
from tests._orphans import pytest_addoption, pytest_pyfunc_call, pytest_timeout_set_timer, session_loop  # noqa: F401


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    # AUTH on, as in every deployment: `url` carries the password for the tests' own clients, and
    # stacks hand it to the roles in a file (deploy/local/stack.py)
    server = RedisServer(password=new_password()).start()
    yield server
    server.cleanup()


@pytest.fixture
async def redis_client(redis_server: RedisServer) -> AsyncIterator[Redis]:
    if redis_server.proc is None or redis_server.proc.poll() is not None:
        redis_server.start()
    client = Redis.from_url(redis_server.url, decode_responses=True)
    await client.flushall()
    yield client
    await client.aclose()


@pytest.fixture
async def ledger(redis_client: Redis) -> Ledger:
    led = Ledger(redis_client)
    await led.load_scripts()
    return led
