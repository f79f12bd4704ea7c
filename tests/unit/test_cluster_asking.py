"""The roles' cluster client sends an ASK redirect's ASKING with the command, on one connection
(shared/store/redis_conn.py _AskingNode; on a real Redis Cluster: tests/redis_ha/test_reshard_ask.py), and relies on
how redis-py's asyncio command loop follows an ASK: checked here, so that an upgrade of redis-py that changes it
fails a test rather than bringing back the commands that bounced between two shards until "TTL exhausted."."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from redis import exceptions as rexc
from redis.asyncio.cluster import ClusterNode, RedisCluster

from shared.store.redis_conn import _AskingNode, _Cluster


def test_redis_py_follows_an_ask_as_the_asking_node_expects() -> None:
    """By name, ASKING alone, then the command, on the node it got (redis-py 7.4.1)."""
    src = inspect.getsource(RedisCluster._execute_command)
    ask = src.index("target_node = self.get_node(node_name=redirect_addr)")
    asking = src.index('await target_node.execute_command("ASKING")', ask)
    src.index("await target_node.execute_command(*args, **kwargs)", asking)


class Conn:
    """What ClusterNode uses of a connection: each write (the commands packed into it), and the replies of
    `replies` in turn (an exception is raised as redis-py raises an error reply)."""

    writes: list[list[tuple[Any, ...]]]
    replies: list[Any]

    is_connected = False  # (nothing to warn of when the node is collected)

    def __init__(self, **_: Any):
        self.closed = 0

    @staticmethod
    def pack_command(*args: Any) -> list[tuple[Any, ...]]:
        return [args]

    @staticmethod
    def pack_commands(commands: Any) -> list[tuple[Any, ...]]:
        return [tuple(c) for c in commands]

    async def send_packed_command(self, packed: list[tuple[Any, ...]], check_health: bool = True) -> None:
        Conn.writes.append(packed)

    async def read_response(self, **_: Any) -> Any:
        reply = Conn.replies.pop(0)
        if isinstance(reply, BaseException):
            raise reply
        return reply

    @staticmethod
    def should_reconnect() -> bool:
        return False

    async def disconnect(self, **_: Any) -> None:
        self.closed += 1


def asked(replies: list[Any]) -> tuple[ClusterNode, _AskingNode]:
    """A node whose connections are Conn, and the node as an ASK finds it (what `_Cluster.get_node` answers)."""
    Conn.writes, Conn.replies = [], list(replies)
    node = ClusterNode("127.0.0.1", 7000, connection_class=Conn)  # type: ignore[arg-type]
    return node, _AskingNode(node)


async def test_asking_goes_in_the_commands_write() -> None:
    node, ask = asked(["OK", "value", "plain"])
    assert await ask.execute_command("ASKING")
    assert Conn.writes == []  # nothing sent yet
    assert await ask.execute_command("SMEMBERS", "mt:nodes") == "value"
    assert Conn.writes == [[("ASKING",), ("SMEMBERS", "mt:nodes")]]
    assert await ask.execute_command("GET", "k") == "plain"  # ASKING is for the next command only
    assert Conn.writes[-1] == [("GET", "k")]
    # the node's own pool: one connection, given back to it
    assert len(node._connections) == 1 and list(node._free) == node._connections
    assert ask.port == 7000 and ask == node and node == ask and hash(ask) == hash(node)
    assert not hasattr(node, "__dict__")  # all a node holds is in its slots, which _AskingNode shares


@pytest.mark.parametrize(("replies", "raised"), [
    (["OK", rexc.MovedError("4413 127.0.0.1:7001")], rexc.MovedError),
    (["OK", rexc.TryAgainError("TRYAGAIN")], rexc.TryAgainError),  # redis-py's loop handles them as before
    ([rexc.NoPermissionError("NOPERM asking"), rexc.MovedError("4413 127.0.0.1:7001")], rexc.NoPermissionError),
    (["OK", rexc.TimeoutError("Timeout reading")], rexc.TimeoutError),  # redis-py refreshes its layout on these
    ([rexc.ConnectionError("Connection closed by server.")], rexc.ConnectionError),
])
async def test_an_error_is_raised_as_redis_py_raised_it(replies: list[Any], raised: type[Exception]) -> None:
    node, ask = asked(replies)
    await ask.execute_command("ASKING")
    with pytest.raises(raised):
        await ask.execute_command("SMEMBERS", "mt:nodes")
    assert list(node._free) == node._connections  # given back (a broken one reconnects at its next use)


async def test_a_command_that_ran_is_answered_whatever_asking_got() -> None:
    _, ask = asked([rexc.ResponseError("ERR"), "value"])
    await ask.execute_command("ASKING")
    assert await ask.execute_command("SMEMBERS", "mt:nodes") == "value"


async def test_only_a_node_asked_by_name_is_wrapped() -> None:
    client = _Cluster(startup_nodes=[ClusterNode("127.0.0.1", 7000)])
    node = ClusterNode("127.0.0.1", 7000)
    client.nodes_manager.nodes_cache[node.name] = node
    try:
        assert client.get_node(host="127.0.0.1", port=7000) is node
        by_name = client.get_node(node_name=node.name)
        assert isinstance(by_name, _AskingNode) and by_name == node
        assert client.get_node(node_name="127.0.0.1:7999") is None  # unknown: as redis-py answers (UnknownRedirect)
    finally:
        await client.aclose()
