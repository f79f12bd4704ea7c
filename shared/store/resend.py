"""Which failures of a Redis call sending it again cures (RESEND), the Ledger's retry rule: a script runs only
where all its keys are and is idempotent by pod uid, so a call Redis did not run, or ran unknown to us, is sent
again."""

from __future__ import annotations

from pathlib import Path

from redis import exceptions as rexc
from redis.asyncio.cluster import RedisCluster

# A round trip Redis did not run for want of a reachable master: a lost connection, a demoted master, a
# cluster that lost a primary or is re-forming its slot map (redis-py 7's cluster client retries the last two
# 3 times in 0.75 s, 8's 10 times, so a restarted shard outlasts 7's own retries). Sending again cures them.
# A cluster client's own retries that ran out on a slot being moved between shards (a live reshard: the keys of a
# node split between two shards answer TRYAGAIN to a script until the move ends, which redis-py reports as
# ClusterError "TTL exhausted."), and a redirect to a shard it does not know yet (UnknownRedirect), are cured
# the same way: a script runs only where all its keys are, so nothing was half-applied.
RESEND: tuple[type[BaseException], ...] = (rexc.ConnectionError, rexc.TimeoutError, rexc.ReadOnlyError,
                                           rexc.ClusterError, rexc.TryAgainError, rexc.SlotNotCoveredError)


class UnknownRedirect(rexc.ClusterError):
    """redis-py's cluster client was sent (ASK, during a live reshard) to a shard it does not know yet, a new
    primary that owns no slot, and failed on it with an AttributeError of its own (redis-py 7.4): the move's
    end (the slot given to that shard, MOVED) cures it."""


class ClosedUnderCommand(rexc.ConnectionError):
    """redis-py's cluster client closed a connection (its slot map refreshed during a live reshard or a failover,
    the node's connections dropped) while another command was on it, which then fails with an AttributeError of
    redis-py's own (`None.writelines`): a lost connection like any other, sent again on a new one (a script is
    idempotent by pod uid). A CI run saw it fail a booking on a node that was not moving."""


RESEND_OR_REDIRECT: tuple[type[BaseException], ...] = (*RESEND, AttributeError)  # what resendable() sorts


def resendable(e: BaseException, client: object) -> BaseException | None:
    """`e` as a RESEND error (UnknownRedirect or ClosedUnderCommand for redis-py's failures above), or None when
    sending again cannot cure it. Only an AttributeError raised inside redis-py's cluster client counts: ours are
    bugs."""
    if isinstance(e, RESEND):
        return e
    if isinstance(e, AttributeError) and isinstance(client, RedisCluster):
        where = _raised_in_redis(e)
        if where == "cluster.py":
            return UnknownRedirect(f"a redirect to a Redis node the cluster client does not know yet ({e})")
        if where == "connection.py":
            return ClosedUnderCommand(f"a connection closed under the command by redis-py's cluster client ({e})")
    return None


def slot_moving(e: BaseException) -> bool:
    """Whether a RESEND error (after resendable()) says that this node's keys are split between two shards by a live
    reshard, which only the move's end cures, rather than that Redis is down: redis-py's retries ran out on TRYAGAIN
    (a plain ClusterError "TTL exhausted.", never its subclasses such as ClusterDownError), or UnknownRedirect. Other
    nodes can still be read (a mirror's resync then reads around it: Ledger.reread `isolate`)."""
    return type(e) is rexc.ClusterError or isinstance(e, (rexc.TryAgainError, UnknownRedirect))


def _raised_in_redis(e: BaseException) -> str:
    """The module of redis-py's asyncio client (cluster.py, connection.py) whose `None.<attribute>` raised `e`: its
    cluster client on a node it does not know, or on a connection it closed meanwhile; "" for anything else."""
    tb = e.__traceback__
    if tb is None:
        return ""
    while tb.tb_next is not None:
        tb = tb.tb_next
    parts = Path(tb.tb_frame.f_code.co_filename).parts[-3:]
    if parts[:2] != ("redis", "asyncio") or "'NoneType' object has no attribute" not in str(e):
        return ""
    return parts[2] if parts[2] in ("cluster.py", "connection.py") else ""
