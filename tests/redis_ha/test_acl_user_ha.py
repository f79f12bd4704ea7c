"""The least-privilege ACL of docs/install.md "Redis" on the HA URL forms: what redis+cluster:// and
redis+sentinel:// need besides the rules every form needs (tests/redis/test_acl_user.py, whose roles' operations
run here unchanged): on a Cluster, redis-py's slot map and command table, the feed subscriber's node list and a
reshard's ASK redirects; on Sentinel, the sentinels' answer naming the master. Each of those rules removed, an
operation fails and the server's ACL LOG names what it refused."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import redis

from deploy.local.redis import ClusterSetup, RedisServer, SentinelSetup
from shared.config import Config, load_config
from tests.redis.test_acl_user import ACL_RULES, PASSWORD, STEPS, USER, A, B, Roles, first_refused, refused
from tests.redis_ha.conftest import own_cluster

pytestmark = pytest.mark.redis_ha

CLUSTER_RULES = ("+cluster|slots", "+cluster|nodes", "+command", "+asking")
SENTINEL_RULES = ("+sentinel|masters",)  # on the sentinels, for the same user

CLUSTER_FIRST_REFUSED = {
    # redis-py reports this refusal as "Cluster mode is not enabled on this node" (its first CLUSTER SLOTS): only
    # the ACL LOG says what it is
    "+cluster|slots": "load the scripts",
    "+command": "load the scripts",  # redis-py's command table, read once the slot map is
    "+cluster|nodes": "mirror: subscribe and read",  # the feed's connection learns the cluster's nodes
    "+asking": "cluster: a read while its slot moves",
}


def grant(clients: list[redis.Redis], rules: tuple[str, ...]) -> None:
    for c in clients:
        c.execute_command("ACL", "SETUSER", USER, "reset", "resetchannels", "on", f">{PASSWORD}", *rules)
        c.acl_log_reset()


def logged(clients: list[redis.Redis]) -> set[tuple[str, str]]:
    out: set[tuple[str, str]] = set()
    for c in clients:
        out |= {(str(e["reason"]), str(e["object"])) for e in c.acl_log()
                if e["username"] == USER and e["object"] not in ("client", "client|setinfo")}
    return out


def config(url: str, tmp_path: Path) -> Config:
    secret = tmp_path / "redis-password"
    secret.write_text(PASSWORD)
    return load_config(env={}, flags={"redisUrl": url, "redisPasswordFile": str(secret)})


@pytest.fixture(scope="module")
def acl_cluster() -> Iterator[ClusterSetup]:
    with own_cluster() as setup:  # (its own: the test moves a slot)
        yield setup


def _clients(servers: list[RedisServer]) -> list[redis.Redis]:
    return [s.client() for s in servers]


def reshard(setup: ClusterSetup) -> Callable[[Roles], Awaitable[None]]:
    async def step(r: Roles) -> None:
        """A read of `mt:nodes` while its slot moves to another primary, the key moved already: Redis answers ASK,
        and the roles' cluster client sends ASKING to the target with the read, on one connection (before, 1 run in
        ~10 failed "TTL exhausted.": redis-py sent the two on different connections once the mirror's reads had
        made a second one to the target; shared/store/redis_conn.py _AskingNode)."""
        owner = setup.owner_of(r.ledger.nodes_key)
        target = next(n for n in setup.nodes[:setup.masters] if n is not owner)
        slot = setup.begin_move(r.ledger.nodes_key, target)
        try:
            assert setup.move_keys(slot, target, 100) == 1
            assert set(await r.ledger.nodes()) == {A, B}
        finally:
            setup.end_move(slot, target)
    return step


@pytest.mark.parametrize("removed", [None, *CLUSTER_RULES])
async def test_cluster(removed: str | None, acl_cluster: ClusterSetup, tmp_path: Path) -> None:
    nodes = _clients(acl_cluster.nodes)
    admin = redis.RedisCluster(host="127.0.0.1", port=acl_cluster.nodes[0].port, password=acl_cluster.password,
                               decode_responses=True)
    try:
        admin.flushall()
        grant(nodes, tuple(r for r in (*ACL_RULES, *CLUSTER_RULES) if r != removed))
        cfg = config(f"redis+cluster://{USER}@127.0.0.1:{acl_cluster.nodes[0].port}", tmp_path)
        steps = (*STEPS, ("cluster: a read while its slot moves", reshard(acl_cluster)))
        got = await first_refused(cfg, admin, tmp_path, steps)  # type: ignore[arg-type]
        if removed is None:
            assert got is None, got
            assert logged(nodes) == set()
            return
        assert got is not None, f"every operation went through without {removed}"
        step, error = got
        assert step == CLUSTER_FIRST_REFUSED[removed], f"{step}: {type(error).__name__}: {error}"
        assert refused(error) or removed == "+cluster|slots", f"{type(error).__name__}: {error}"
        assert ("command", removed[1:]) in logged(nodes), logged(nodes)
    finally:
        for c in nodes:
            with contextlib.suppress(redis.RedisError):
                c.acl_deluser(USER)
            c.close()
        admin.close()


@pytest.mark.parametrize("removed", [None, *SENTINEL_RULES])
async def test_sentinel(removed: str | None, sentinel_setup: SentinelSetup, tmp_path: Path) -> None:
    data = _clients(sentinel_setup.data)  # every data node: a replica promoted by a failover must know the user
    sentinels = [sentinel_setup.sentinel_client(i) for i in range(len(sentinel_setup.sentinel_ports))]
    admin = sentinel_setup.master().client()
    try:
        admin.flushall()
        grant(data, ACL_RULES)
        grant(sentinels, tuple(r for r in SENTINEL_RULES if r != removed))
        hosts = ",".join(f"127.0.0.1:{p}" for p in sentinel_setup.sentinel_ports)
        cfg = config(f"redis+sentinel://{USER}@{hosts}/{sentinel_setup.service}", tmp_path)
        got = await first_refused(cfg, admin, tmp_path)
        if removed is None:
            assert got is None, got
            assert logged(data) == set() and logged(sentinels) == set()
            return
        assert got is not None and got[0] == "load the scripts" and refused(got[1]), got
        assert ("command", removed[1:]) in logged(sentinels), logged(sentinels)
    finally:
        for c in (*data, *sentinels):
            with contextlib.suppress(redis.RedisError):
                c.acl_deluser(USER)
            c.close()
        admin.close()
