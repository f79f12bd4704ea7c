"""A standalone Redis behind one address (a Kubernetes Service, a VIP) that moves to a new server while the old one
is cut off: the connections open to the old one get no answer and no reset (its node lost the network), new ones
reach the new server. The roles' clients must leave the old connections within the socket timeout
(redis_conn.SOCKET_TIMEOUT) and go on with the new server; before, each call on such a connection waited for as
long as TCP takes to give up (~15 min), with the watchers' pass and every bind stuck in it.

Real parts: two redis-servers, the product's connect() and Ledger; the address is a loopback TCP relay."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest

from deploy.local.redis import RedisServer
from shared.store.ledger import Ledger
from shared.store.redis_conn import SOCKET_TIMEOUT, connect
from tests.redis.helpers import S4000, inventory


class Address:
    """A loopback port in front of one Redis at a time. `move(port)`: new connections go there; the ones open
    before get nothing more in either direction and are never closed (a black hole, not a reset)."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.generation = 0
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> Address:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def move(self, target: int) -> None:
        self.target, self.generation = target, self.generation + 1

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        born = self.generation
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        self._writers += [writer, up_writer]

        async def relay(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            while data := await src.read(65536):
                if self.generation == born:  # once moved, what this connection sends goes nowhere
                    dst.write(data)
                    await dst.drain()

        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(relay(src, dst))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for w in self._writers:
            w.close()
        await asyncio.gather(*self._tasks, return_exceptions=True)


@pytest.fixture
async def second_redis(redis_server: RedisServer) -> AsyncIterator[RedisServer]:
    server = RedisServer(password=redis_server.password).start()
    yield server
    server.cleanup()


async def test_the_ledger_leaves_the_old_server_of_an_address_that_moved(
        redis_server: RedisServer, second_redis: RedisServer) -> None:
    address = await Address(redis_server.port).start()
    led = Ledger(connect(f"redis://:{redis_server.password}@127.0.0.1:{address.port}/0"))
    try:
        await led.load_scripts()
        await asyncio.gather(*(led.redis_time_ms() for _ in range(4)))  # idle connections in the pool
        address.move(second_redis.port)
        took = []
        for _ in range(2):
            t = time.monotonic()
            # bounded: without the socket timeout the first call waits for ever here
            await asyncio.wait_for(led.redis_time_ms(), 3 * SOCKET_TIMEOUT)
            took.append(time.monotonic() - t)
        # the first call met an old connection once, and left the other idle ones with it (counted in socket
        # timeouts, each waited out whole: the first met at most one, the second none)
        assert took[0] < 2 * SOCKET_TIMEOUT and took[1] < SOCKET_TIMEOUT, took
        # and a script writes on the new server (loaded there again: it never had them)
        await led.upsert_node(inventory("gpu-1", S4000))
        assert "gpu-1" in await led.snapshots(["gpu-1"])
        with second_redis.client() as c:
            assert c.exists("mt:{gpu-1}:node") == 1
        with redis_server.client() as c:
            assert c.exists("mt:{gpu-1}:node") == 0
    finally:
        with contextlib.suppress(Exception):
            await led.redis.aclose()
        await address.close()
