"""A feed connection that dies without a reset is noticed and replaced (shared/store/mirror.py, the liveness PING):
the mirror PINGs a feed that has been silent for `silence_seconds`, and reconnects (re-reading everything) when
the pong does not come in as long again. Real Redis, reached through a loopback proxy whose open connections can
be frozen: nothing more is forwarded either way and nothing is closed, as when a peer or a route vanished."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import pytest
from redis.asyncio import Redis

from deploy.local.redis import RedisServer
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from tests.redis.helpers import eventually


class FreezingProxy:
    """Forwards TCP connections to Redis; `freeze()` makes every connection open now a black hole."""

    def __init__(self, host: str, port: int):
        self.target = (host, port)
        self.frozen: set[int] = set()
        self.open: set[int] = set()
        self.accepted = 0
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    def freeze(self) -> None:
        self.frozen |= self.open

    async def _pipe(self, conn: int, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        while data := await src.read(65536):
            if conn not in self.frozen:  # a frozen connection's bytes are read and dropped: no reset, no close
                dst.write(data)
                await dst.drain()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        conn = self.accepted
        self.open.add(conn)
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self._writers += [writer, up_writer]
        for t in (asyncio.create_task(self._pipe(conn, reader, up_writer)),
                  asyncio.create_task(self._pipe(conn, up_reader, writer))):
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        for w in self._writers:
            w.close()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


def _through(url: str, port: int) -> str:
    u = urlsplit(url)
    netloc = u.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{port}"
    return urlunsplit(u._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host))


@contextlib.asynccontextmanager
async def mirrored(redis_server: RedisServer, silence: float) -> AsyncIterator[tuple[Mirror, FreezingProxy, Ledger]]:
    """A started mirror whose feed goes through a FreezingProxy (its ledger reads do not), with no periodic
    resync within a test: only the feed, or a reconnection's re-read, can bring it a change."""
    u = urlsplit(redis_server.url)
    proxy = FreezingProxy(u.hostname or "127.0.0.1", u.port or 6379)
    port = await proxy.start()
    client = Redis.from_url(redis_server.url, decode_responses=True)
    sub = Redis.from_url(_through(redis_server.url, port), decode_responses=True)
    writer = Ledger(Redis.from_url(redis_server.url, decode_responses=True))
    await writer.load_scripts()
    m = Mirror(Ledger(client), subscriber=sub, resync_seconds=3600.0, silence_seconds=silence)
    await m.start()
    try:
        await asyncio.wait_for(m.ready.wait(), 10)
        yield m, proxy, writer
    finally:
        await m.stop()
        for c in (client, sub, writer.redis):
            await c.aclose()
        await proxy.close()


@pytest.mark.redis
async def test_a_feed_that_died_silently_is_replaced_and_the_change_it_lost_is_read(
        cluster: Ledger, redis_server: RedisServer) -> None:
    async with mirrored(redis_server, silence=0.3) as (m, proxy, writer):
        assert m.get("n4") is not None and "u1" not in m.get("n4").reservations  # type: ignore[union-attr]
        proxy.freeze()  # the feed connection is now a black hole
        assert (await writer.reserve("n4", "u1", [0], 8, 2, 1, pod="ns/p1"))[0].ok

        def booked() -> bool:
            snap = m.get("n4")
            return snap is not None and "u1" in snap.reservations

        await eventually(booked, within=20, what="the booking, once the silent feed was replaced")
        assert m.pings >= 1 and m.silences >= 1
        assert proxy.accepted >= 2  # a new feed connection
        assert m.ready.is_set()
        # and the new connection brings the feed again
        assert await writer.release("n4", "u1")
        await eventually(lambda: not booked(), within=10, what="the release, through the new feed")


@pytest.mark.redis
async def test_an_idle_feed_that_answers_is_kept(cluster: Ledger, redis_server: RedisServer) -> None:
    # (1 s to answer each: the proxy shares this test's loop, and a stall of a tenth of a second on a busy machine
    # would take a healthy connection for a silent one)
    async with mirrored(redis_server, silence=1.0) as (m, proxy, writer):
        await eventually(lambda: m.pings >= 3, within=30, what="three liveness PINGs on an idle feed")
        assert m.silences == 0 and proxy.accepted == 1  # each answered: the connection was kept
        assert (await writer.reserve("n4", "u1", [0], 8, 2, 1, pod="ns/p1"))[0].ok
        await eventually(lambda: "u1" in m.get("n4").reservations,  # type: ignore[union-attr]
                         within=10, what="the booking, through the feed")
