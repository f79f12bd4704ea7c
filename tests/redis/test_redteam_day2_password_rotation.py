"""Red team, day 2: the Redis password rotated while the roles run.

The operator writes a new password into the Secret (the roles' `redisPasswordFile`) and gives it to Redis; Redis
keeps the connections it has, so the roles go on until they connect again (a Redis restart, a dropped connection).
Then a role, which read the file at its start, is refused: it must stay up, unready, saying in its readiness what
install.md says it says ("Redis refused the password", and where the password comes from), keep trying rather
than give up (a restart by the kubelet is the documented cure, not a crash loop of the old password), and a
restart with the new file must be ready."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from deploy.local.redis import RedisServer, new_password
from shared.config import Config, load_config
from shared.serving.supervise import Supervisor
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror
from shared.store.session import open_ledger

pytestmark = pytest.mark.redis


@pytest.fixture
def server() -> Iterator[RedisServer]:
    s = RedisServer(password=new_password()).start()
    yield s
    s.cleanup()


@dataclass
class Role:
    cfg: Config
    secret: Path
    admin: redis.Redis
    sup: Supervisor
    ledger: Ledger
    mirror: Mirror


@contextlib.asynccontextmanager
async def role(server: RedisServer, tmp_path: Path) -> AsyncIterator[Role]:
    """A role's ledger session as the chart starts it (the password in redisPasswordFile), ready, and the server's
    admin client."""
    secret = tmp_path / "password"
    secret.write_text(f"{server.password}\n")
    cfg = load_config(env={}, flags={"redisUrl": f"redis://127.0.0.1:{server.port}/0",
                                     "redisPasswordFile": str(secret)})
    admin = redis.Redis(port=server.port, password=server.password, decode_responses=True)
    sup = Supervisor(max_failures=2, unready_after=0.2, healthy_after=0.5)
    stop = asyncio.Event()
    ledger, mirror = await open_ledger(cfg, sup, stop=stop)
    try:
        await _until(lambda: not sup.problems(), 15, "the role got ready")
        yield Role(cfg, secret, admin, sup, ledger, mirror)
    finally:
        stop.set()
        await sup.cancel()
        await ledger.redis.aclose()
        await mirror.subscriber.aclose()
        admin.close()


async def _until(cond: object, within: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + within
    while not cond():  # type: ignore[operator]
        assert loop.time() < end, what
        await asyncio.sleep(0.05)


async def test_a_rotated_password_is_said_and_a_restart_heals(server: RedisServer, tmp_path: Path) -> None:
    async with role(server, tmp_path) as r:
        sup = r.sup
        rotated = new_password()
        r.secret.write_text(f"{rotated}\n")  # the Secret updated...
        r.admin.config_set("requirepass", rotated)  # ... and Redis given it: connections made before stay
        r.admin.execute_command("CLIENT", "KILL", "SKIPME", "yes")  # then every other connection drops
        await _until(lambda: bool(sup.problems()), 15, "the refused role stayed ready")
        await _until(lambda: any("Redis refused the password" in p and "redisPasswordFile" in p
                                 for p in sup.problems()), 15, f"readiness said: {sup.problems()}")
        assert not sup.failed.is_set(), sup.fatal  # it keeps trying: no crash loop on the old password
        assert all(rotated not in p and str(server.password) not in p for p in sup.problems())
        cfg = r.cfg
    # the restart: the file is read again
    sup2, stop2 = Supervisor(), asyncio.Event()
    ledger2, mirror2 = await asyncio.wait_for(open_ledger(cfg, sup2, stop=stop2), 15)
    try:
        await _until(lambda: not sup2.problems(), 15, f"the restarted role: {sup2.problems()}")
    finally:
        stop2.set()
        await sup2.cancel()
        await ledger2.redis.aclose()
        await mirror2.subscriber.aclose()


async def test_a_refused_role_heals_once_redis_has_its_password_again(
        server: RedisServer, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The rotation rolled back (Redis given the old password again, the roles never restarted): the refused role,
    which kept trying with the password it read at its start, is ready again by itself, its mirror in sync with
    what was written meanwhile; the mirror's log said the refusal in words, never a password."""
    from tests.redis.helpers import S4000, inventory

    rotated = new_password()
    async with role(server, tmp_path) as r:
        sup, admin = r.sup, r.admin
        admin.config_set("requirepass", rotated)
        admin.execute_command("CLIENT", "KILL", "SKIPME", "yes")
        await _until(lambda: any("Redis refused the password" in p for p in sup.problems()), 15,
                     f"readiness said: {sup.problems()}")
        await _until(lambda: any("mirror lost Redis (Redis refused the password" in rec.getMessage()
                                 for rec in caplog.records), 15, "the mirror's log did not explain the refusal")
        admin.config_set("requirepass", str(server.password))  # rolled back: the role's own password again
        other = Ledger(redis.asyncio.Redis(port=server.port, password=server.password, decode_responses=True))
        try:
            await other.load_scripts()
            await other.upsert_node(inventory("written-meanwhile", S4000, 1))
            await _until(lambda: not sup.problems() and r.mirror.get("written-meanwhile") is not None, 20,
                         f"not healed: {sup.problems()}")
        finally:
            await other.redis.aclose()
        assert not sup.failed.is_set(), sup.fatal
        said = " ".join(rec.getMessage() for rec in caplog.records)
        assert rotated not in said and str(server.password) not in said
