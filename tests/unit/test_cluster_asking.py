"""The roles' cluster client sends an ASK redirect's ASKING with the command, on one connection
(shared/store/redis_conn.py _AskingNode; on a real Redis Cluster: tests/redis_ha/test_reshard_ask.py), and relies on
how redis-py's asyncio command loop follows an ASK: checked here, so that an upgrade of redis-py that changes it
fails a test rather than bringing back the commands that bounced between two shards until "TTL exhausted."."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from redis import exceptions as rexc
from redis.asyncio.cluster import ClusterNode, PipelineCommand, RedisCluster

from shared.store.redis_conn import _AskingNode, _Cluster


def test_redis_py_follows_an_ask_as_the_asking_node_expects() -> None:
    """By name, ASKING alone, then the command, on the node it got (redis-py 7.4.1)."""
    src = inspect.getsource(RedisCluster._execute_command)
    ask = src.index("target_node = self.get_node(node_name=redirect_addr)")
    asking = src.index('await target_node.execute_command("ASKING")', ask)
    src.index("await target_node.execute_command(*args, **kwargs)", asking)


class Node:
    """What _AskingNode uses of a ClusterNode: each call's commands, as one write each, with the replies given."""

    name = "127.0.0.1:7000"
    host, port = "127.0.0.1", 7000

    def __init__(self, replies: list[Any] | None = None):
        self.writes: list[list[tuple[Any, ...]]] = []
        self.replies = replies or ["OK", "value"]

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        self.writes.append([args])
        return "plain"

    async def execute_pipeline(self, commands: list[PipelineCommand]) -> bool:
        self.writes.append([c.args for c in commands])
        for c, reply in zip(commands, self.replies, strict=True):
            c.result = reply
        return any(isinstance(r, Exception) for r in self.replies)


async def test_asking_goes_in_the_commands_write() -> None:
    node = Node()
    asked = _AskingNode(node)  # type: ignore[arg-type]
    assert await asked.execute_command("ASKING")
    assert node.writes == []  # nothing sent yet
    assert await asked.execute_command("SMEMBERS", "mt:nodes") == "value"
    assert node.writes == [[("ASKING",), ("SMEMBERS", "mt:nodes")]]
    assert await asked.execute_command("GET", "k") == "plain"  # ASKING is for the next command only
    assert node.writes[-1] == [("GET", "k")]
    assert asked.port == 7000 and asked == node and hash(asked) == hash(node)  # everything else: the node's


@pytest.mark.parametrize(("replies", "raised"), [
    (["OK", rexc.MovedError("4413 127.0.0.1:7001")], rexc.MovedError),
    (["OK", rexc.TryAgainError("TRYAGAIN")], rexc.TryAgainError),  # redis-py's loop handles them as before
    ([rexc.NoPermissionError("NOPERM asking"), rexc.MovedError("4413 127.0.0.1:7001")], rexc.NoPermissionError),
])
async def test_an_error_is_raised_as_redis_py_raised_it(replies: list[Any], raised: type[Exception]) -> None:
    asked = _AskingNode(Node(replies))  # type: ignore[arg-type]
    await asked.execute_command("ASKING")
    with pytest.raises(raised):
        await asked.execute_command("SMEMBERS", "mt:nodes")


async def test_a_command_that_ran_is_answered_whatever_asking_got() -> None:
    asked = _AskingNode(Node([rexc.ResponseError("ERR"), "value"]))  # type: ignore[arg-type]
    await asked.execute_command("ASKING")
    assert await asked.execute_command("SMEMBERS", "mt:nodes") == "value"


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
