"""Helpers for the ledger tests: inventories, a full dump of the ledger's keys, invariant checks.

Also imported by the stress workers (spawned processes) and by bench/ledger_bench.py's checks, so
it only depends on shared/ and redis.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from redis import exceptions as rexc
from redis.asyncio import Redis

from shared.domain.annotations import PodUsage
from shared.domain.node import Card, Inventory
from shared.domain.state import NodeSnapshot
from shared.store.ledger import Ledger
from shared.store.mirror import FULL_EVERY, Mirror
from tests._wait import eventually as eventually  # re-exported: the redis tests import it from here

if TYPE_CHECKING:
    import pytest

S4000 = 96
S5000 = 160


def inventory(node: str, capacity: int, n: int = 2, slice_limit: int = 16, cordoned: Iterable[int] = (),
              unhealthy: Iterable[int] = (), indices: Iterable[int] | None = None,
              error: str = "") -> Inventory:
    """A node with `n` cards of `capacity` units (indices 0..n-1 unless given)."""
    if error:
        return Inventory(node, error=error)
    cord, sick = set(cordoned), set(unhealthy)
    idx = list(indices) if indices is not None else list(range(n))
    return Inventory(node, tuple(Card(node, i, capacity, slice_limit, healthy=i not in sick,
                                      cordoned=i in cord) for i in idx))


async def dump(redis: Redis, pattern: str = "mt:*") -> dict[str, Any]:
    """Every key of the ledger with its type and full contents (for before/after comparisons)."""
    out: dict[str, Any] = {}
    async for key in redis.scan_iter(match=pattern, count=1000):
        kind = await redis.type(key)
        if kind == "hash":
            out[key] = ("hash", await redis.hgetall(key))  # type: ignore[misc]
        elif kind == "set":
            out[key] = ("set", sorted(await redis.smembers(key)))  # type: ignore[misc]
        elif kind == "string":
            out[key] = ("string", await redis.get(key))
        else:
            out[key] = (kind, None)
    return dict(sorted(out.items()))


def violations(snap: NodeSnapshot, allow_overcommit: bool = False) -> list[str]:
    """Broken invariants of one node's snapshot (empty when all hold).

    Per card: 0 <= used <= capacity, free == capacity - used (memory and cores), 0 <= slices <= limit,
    and the live reservations on the card add up to exactly what the card says is used.
    """
    errs: list[str] = []
    sums: dict[int, list[int]] = {i: [0, 0, 0] for i in snap.cards}
    for r in snap.reservations.values():
        if not r.cards:
            errs.append(f"{snap.node}: reservation {r.uid} holds no card")
        if r.state not in ("pending", "bound"):
            errs.append(f"{snap.node}: reservation {r.uid} has state {r.state!r}")
        for i in r.cards:
            if i not in sums:
                errs.append(f"{snap.node}: reservation {r.uid} on card {i} that the node does not list")
                continue
            sums[i][0] += r.mem
            sums[i][1] += r.cores
            sums[i][2] += r.slices
    for i, c in snap.cards.items():
        where = f"{snap.node} card {i}"
        if not allow_overcommit:
            if not 0 <= c.mem_used <= c.capacity:
                errs.append(f"{where}: mem_used {c.mem_used} outside 0..{c.capacity}")
            if not 0 <= c.cores_used <= c.cores:
                errs.append(f"{where}: cores_used {c.cores_used} outside 0..{c.cores}")
            if not 0 <= c.slices <= c.slice_limit:
                errs.append(f"{where}: slices {c.slices} outside 0..{c.slice_limit}")
        if not 0 <= c.mem_free <= c.capacity or c.mem_free != max(0, c.capacity - c.mem_used):
            errs.append(f"{where}: mem_free {c.mem_free} but capacity {c.capacity} and used {c.mem_used}")
        if not 0 <= c.cores_free <= c.cores or c.cores_free != max(0, c.cores - c.cores_used):
            errs.append(f"{where}: cores_free {c.cores_free} but cores {c.cores} and used {c.cores_used}")
        if sums[i] != [c.mem_used, c.cores_used, c.slices]:
            errs.append(f"{where}: reservations add up to mem/cores/slices {sums[i]} but the card says "
                        f"{[c.mem_used, c.cores_used, c.slices]}")
        if c.health == "removed" and c.mem_used == 0 and c.cores_used == 0 and c.slices == 0:
            errs.append(f"{where}: removed card kept although nothing holds it")
    return errs


def all_violations(snaps: Mapping[str, NodeSnapshot], allow_overcommit: bool = False) -> list[str]:
    return [e for s in snaps.values() for e in violations(s, allow_overcommit)]


def expected_usage(placements: Iterable[PodUsage]) -> dict[tuple[str, int], tuple[int, int, int]]:
    """Per (node, card): the memory, cores and slices that a set of placements implies."""
    out: dict[tuple[str, int], list[int]] = {}
    for u in placements:
        for i in u.cards:
            acc = out.setdefault((u.node, i), [0, 0, 0])
            acc[0] += u.memory
            acc[1] += u.cores
            acc[2] += u.slices
    return {k: (v[0], v[1], v[2]) for k, v in out.items()}


def actual_usage(snaps: Mapping[str, NodeSnapshot]) -> dict[tuple[str, int], tuple[int, int, int]]:
    """Per (node, card) with anything booked: memory, cores and slices used."""
    return {(n, i): (c.mem_used, c.cores_used, c.slices) for n, s in snaps.items() for i, c in s.cards.items()
            if c.mem_used or c.cores_used or c.slices}


# -- pods as the scheduler sees them (admitted: memory and cores explicit) -------------------------------

VGPU = "mthreads.com/vgpu"
MEM = "mthreads.com/sgpu-memory"
CORE = "mthreads.com/sgpu-core"


def slice_pod(*containers: tuple[int, int], pin: str | None = None) -> dict[str, Any]:
    """A pod of slice containers, each (memory units, cores); vgpu 1 each."""
    return _pod([{VGPU: "1", MEM: str(m), CORE: str(c)} for m, c in containers], pin)


def exclusive_pod(pin: str | None = None) -> dict[str, Any]:
    """vgpu 1 alone: one whole card."""
    return _pod([{VGPU: "1"}], pin)


def multi_pod(cards: int, pin: str | None = None) -> dict[str, Any]:
    """vgpu N > 1: N whole cards."""
    return _pod([{VGPU: str(cards)}], pin)


def _pod(limits: list[dict[str, str]], pin: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "namespace": "default"}
    if pin:
        meta["annotations"] = {"mtsched.io/card-memory": pin}
    return {"metadata": meta, "spec": {"containers": [
        {"name": f"c{i}", "resources": {"limits": lim}} for i, lim in enumerate(limits)]}}


async def truth(led: Ledger) -> dict[str, NodeSnapshot]:
    """Every node's snapshot as the ledger holds it now."""
    return dict(await led.snapshots(await led.nodes()))


def periodic(m: Mirror) -> None:
    """Make the mirror's next resync a periodic one that does not read every node (not a FULL_EVERY-th)."""
    while (m.resyncs + 1) % FULL_EVERY == 0:
        m.resyncs += 1


async def evict_exactly(client: Redis, victims: set[str], ballast: int = 400, size: int = 1024) -> int:
    """A real eviction by a full `allkeys-lfu` Redis that drops the keys `victims` and no other key of ours.

    Redis picks what it evicts by each key's LFU counter: every victim is restored with frequency 0, every other
    key with 255, and `ballast` keys of another application (frequency 100) absorb the memory accounting's
    noise. The limit is lowered step by step (bounded) until Redis has evicted every victim; then the ballast is
    deleted and the server set back to noeviction. Returns how many keys it evicted."""
    before = int((await client.info("stats"))["evicted_keys"])
    raw = Redis(**{**client.connection_pool.connection_kwargs, "decode_responses": False})
    try:
        await client.config_set("maxmemory-policy", "allkeys-lfu")
        await client.config_set("maxmemory-samples", 64)
        ours = [k async for k in client.scan_iter("*", count=1000)]
        for k in ours:
            await raw.execute_command("RESTORE", k, 0, await raw.dump(k), "REPLACE", "FREQ", 0 if k in victims else 255)
        for i in range(ballast):
            await raw.set(f"other:{i}", b"x" * size)
            await raw.execute_command("RESTORE", f"other:{i}", 0, await raw.dump(f"other:{i}"), "REPLACE", "FREQ", 100)
        used = int((await client.info("memory"))["used_memory"])
        for drop in range(-100_000, max(ballast * size // 2, 2000), 2000):
            await client.config_set("maxmemory", max(1, used - drop))
            await client.ping()  # any command: Redis evicts before it
            if not await client.exists(*victims):
                break
    finally:
        await client.config_set("maxmemory", 0)
        await client.config_set("maxmemory-policy", "noeviction")
        await client.config_set("maxmemory-samples", 5)
        others = [k async for k in client.scan_iter("other:*", count=1000)]
        if others:
            await client.delete(*others)
        await raw.aclose()
    assert not await client.exists(*victims), "Redis did not evict the victims"
    kept = [k for k in ours if k not in victims and not await client.exists(k)]
    assert not kept, f"the eviction took more of ours than asked: {kept}"
    return int((await client.info("stats"))["evicted_keys"]) - before


def hold_confirmations(ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """Holds every `ledger.mark_bound_many` (a bind's confirmation) until the event returned is set."""
    go = asyncio.Event()
    real = ledger.mark_bound_many

    async def held(node_name: str, uids: list[str]) -> list[str]:
        await go.wait()
        return await real(node_name, uids)

    monkeypatch.setattr(ledger, "mark_bound_many", held)
    return go


def around_script(ledger: Ledger, script: str, before: Callable[[], Awaitable[None]] | None = None,
                  after: Callable[[], Awaitable[None]] | None = None) -> list[Any]:
    """The next run of `script` by `ledger`: `before` runs first (its command held back until then), and/or it runs,
    `after` runs and its reply is lost (a timeout: the ledger sends it again). Returns the raw replies of its runs."""
    real = ledger._scripts[script]
    runs: list[Any] = []

    async def run(keys: Any = None, args: Any = None, client: Any = None) -> Any:
        if before is not None and not runs:
            await before()
        out = await real(keys, args)
        runs.append(out)
        if after is not None and len(runs) == 1:
            await after()
            raise rexc.TimeoutError("Timeout reading from socket")
        return out

    ledger._scripts[script] = run  # type: ignore[assignment]
    return runs
