"""`python -m bench.cancel_probe`: how many cancellations of a task awaiting a Redis command get lost.

A diagnostic, not a test (it asserts nothing). A task runs `GET` in a loop against a real redis-server (started
here, loopback, AUTH on); the probe cancels it after a short, varying delay and counts the tasks that are still
running a second later, i.e. whose CancelledError never reached them (then they are stopped by a flag).

Found while a CI run hung (tests/redis/test_stress.py's checker polled on after its cancel): with redis-py 8.1.0
most cancels are lost (52 of 60 on the last run, 41 of 60 before, 43 of 60 with 8.0.1); with 7.4.1 (the pin since),
7.0.1, 6.4.0 and 5.2.1 none, on a client without a socket timeout. The roles' client has one (5 s), and with it
7.4.1 loses them too (23-32 of 60, 2026-12-07, a red team's finding): Python 3.11's asyncio.wait_for, under which
redis-py sends each command then, returns a result that completes as its caller is cancelled and drops the cancel.
The roles' clients send under `within` instead (shared/store/redis_conn.py `_keep_cancels`): 0 lost. Each run counts
the library alone without and with a socket timeout, and as the roles run it. Run it with any redis-py before moving
to it (`pip install --no-deps --target DIR redis==X` and PYTHONPATH=DIR to compare): the pin moves to 8.x only once
the roles' line counts 0. What a lost cancel meant for the roles (before `within`): a `wait_for` around a Redis
call (the readiness probe, shared/serving/supervise.py probe_loop) could wait for the call to finish instead of
timing out (readiness itself is the age of the last good PING, so it stays honest), and a cancelled task may go on
(Supervisor.cancel gives up on it after 5 s and names it).
docs/runbooks.md, "Known issue: lost cancellations".

  python -m bench.cancel_probe --trials 60
"""

from __future__ import annotations

import argparse
import asyncio

import redis
import redis.asyncio.connection as connection_module
from redis.asyncio import Redis

from deploy.local.redis_server import RedisServer, new_password
from shared.store.redis_conn import SOCKET_TIMEOUT


async def count_lost(client: Redis, trials: int) -> int:
    """How many of `trials` cancels of a task looping on GET through `client` never reached it."""
    await client.set("k", "v")
    lost = 0
    for trial in range(trials):
        stop = asyncio.Event()

        async def loop(stop: asyncio.Event = stop) -> None:
            while not stop.is_set():
                await client.get("k")

        task = asyncio.create_task(loop())
        await asyncio.sleep(0.01 + (trial % 7) * 0.0013)  # cancelled at varying points of its calls
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=1.0)
        if not done:
            lost += 1
            stop.set()  # the cancel did not reach it: end it by the flag
            await asyncio.wait({task}, timeout=2.0)
    return lost


async def probe(trials: int, socket_timeout: float | None = None) -> int:
    server = RedisServer(password=new_password()).start()
    try:
        client = Redis.from_url(server.url, decode_responses=True, socket_timeout=socket_timeout)
        try:
            return await count_lost(client, trials)
        finally:
            await client.aclose()
    finally:
        server.cleanup()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=60)
    a = p.parse_args(argv)
    # the library as it is, without and with a socket timeout, and as the roles run it: with a socket timeout (every
    # client of theirs has one) and redis-py's connection module sending under `within`, not 3.11's wait_for
    # (shared/store/redis_conn.py _keep_cancels, installed by the import above)
    keeping = getattr(connection_module, "asyncio")  # noqa: B009 (mypy: not exported)
    runs = [("no socket timeout", None, asyncio), (f"socket_timeout={SOCKET_TIMEOUT:g} s", SOCKET_TIMEOUT, asyncio),
            (f"socket_timeout={SOCKET_TIMEOUT:g} s, as the roles run it", SOCKET_TIMEOUT, keeping)]
    for how, timeout, module in runs:
        setattr(connection_module, "asyncio", module)  # noqa: B010
        try:
            lost = asyncio.run(probe(a.trials, timeout))
        finally:
            setattr(connection_module, "asyncio", keeping)  # noqa: B010
        print(f"redis-py {redis.__version__}, {how}: {lost} of {a.trials} cancellations lost")


if __name__ == "__main__":
    main()
