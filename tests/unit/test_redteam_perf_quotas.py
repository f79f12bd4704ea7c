"""Red team of the shared, read-ahead quota read (webhook/quotas.py): cancellation of every waiter, a failed
read ahead, the clock's edges, a quota created while an entry is held, an answer too big for the cache, many
namespaces at once. Each asserts the promise: no answer older than the interval (plus the read), a failed read
refuses and is not kept, nothing left behind (reads in flight, unretrieved exceptions)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Mapping
from typing import Any

import pytest

from shared.config import load_config
from shared.domain.admission import Decision, decide
from webhook.quotas import QUOTA_CACHE_BYTES, QuotaReader

CFG = load_config(env={}, flags={"memoryPerCard": "96,160"})
MEM, CORE, VGPU = "mthreads.com/sgpu-memory", "mthreads.com/sgpu-core", "mthreads.com/vgpu"
TIGHT = {"metadata": {"name": "gpu"}, "spec": {"hard": {f"limits.{VGPU}": "0"}}}  # refuses any slice


def pod(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"containers": [
        {"name": "c", "resources": {"limits": {VGPU: "1", MEM: "2", CORE: "1"}}}]}}


class Api:
    """Quotas per namespace (a list, or an exception raised); reads wait on `gate` while it is clear."""

    def __init__(self, quotas: Mapping[str, Any]):
        self.quotas = dict(quotas)
        self.gate = asyncio.Event()
        self.gate.set()
        self.reads: list[str] = []

    async def request(self, method: str, path: str, body: Any = None, query: Mapping[str, Any] | None = None,
                      ok: tuple[int, ...] = (200, 201), content_type: str = "application/json",
                      timeout: float = 30.0, patience: float = 0.0) -> Any:
        ns = path.split("/")[4]
        if path.endswith("/pods"):
            return {"items": []}
        self.reads.append(ns)
        await self.gate.wait()
        out = self.quotas[ns]
        if isinstance(out, BaseException):
            raise out
        return {"items": out}


def review(reader: QuotaReader, ns: str = "team") -> Any:
    p = pod("p")
    return reader.judge(ns, p, decide(p, CFG, {96}))


def run_catching(main: Any) -> list[dict[str, Any]]:
    """Run main; what the loop's exception handler saw (an 'exception was never retrieved' lands there)."""
    seen: list[dict[str, Any]] = []

    async def wrapped() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: seen.append(ctx))
        await main()
        gc.collect()
        await asyncio.sleep(0)

    asyncio.run(wrapped())
    gc.collect()
    return seen


def test_every_waiter_cancelled_then_the_read_fails_leaves_nothing_behind() -> None:
    api = Api({"team": TimeoutError("away")})
    reader = QuotaReader(api, CFG)

    async def main() -> None:
        api.gate.clear()
        reviews = [asyncio.ensure_future(review(reader)) for _ in range(5)]
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        for r in reviews:
            r.cancel()
        await asyncio.gather(*reviews, return_exceptions=True)
        api.gate.set()
        for _ in range(5):
            await asyncio.sleep(0)
        assert reader._reading == {} and "team" not in reader._quotas  # the failure is not kept
        api.quotas["team"] = [TIGHT]
        d = await review(reader)
        assert not d.allowed and d.code == 403 and api.reads == ["team", "team"]  # read again: refused by quota

    assert run_catching(main) == []


def test_every_waiter_cancelled_then_the_read_lands_is_kept_for_the_next() -> None:
    api = Api({"team": [TIGHT]})
    reader = QuotaReader(api, CFG)

    async def main() -> None:
        api.gate.clear()
        r = asyncio.ensure_future(review(reader))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        r.cancel()
        api.gate.set()
        for _ in range(5):
            await asyncio.sleep(0)
        assert not (await review(reader)).allowed and api.reads == ["team"]

    assert run_catching(main) == []


def test_a_failed_read_ahead_serves_the_entry_only_until_it_lapses_then_refuses() -> None:
    clock = [100.0]
    api = Api({"team": [TIGHT]})
    reader = QuotaReader(api, CFG, cache_seconds=2.0, clock=lambda: clock[0])

    async def main() -> None:
        assert not (await review(reader)).allowed  # entry until 102.0
        api.quotas["team"] = ConnectionError("away")
        clock[0] = 101.5  # exactly the start of the last quarter: answered from the entry, reads ahead
        assert not (await review(reader)).allowed
        for _ in range(5):
            await asyncio.sleep(0)
        assert api.reads == ["team", "team"] and reader._reading == {}
        clock[0] = 101.999  # still inside: the entry (1.999 s old) answers; another read ahead, failing too
        assert not (await review(reader)).allowed
        for _ in range(5):
            await asyncio.sleep(0)
        clock[0] = 102.0  # exactly lapsed: never the old entry; the read fails, the pod is refused as transient
        d = await review(reader)
        assert not d.allowed and d.code == 503 and "cannot check" in d.message
        assert reader._reading == {}

    assert run_catching(main) == []


def test_a_quota_created_while_an_entry_is_held_holds_within_the_interval() -> None:
    clock = [100.0]
    api = Api({"team": []})
    reader = QuotaReader(api, CFG, cache_seconds=2.0, clock=lambda: clock[0])

    async def main() -> list[tuple[float, bool]]:
        out: list[tuple[float, bool]] = []
        assert (await review(reader)).allowed  # read at 100.0: no quota
        api.quotas["team"] = [TIGHT]  # created just after
        for t in (100.5, 101.0, 101.49, 101.5, 101.7, 101.99, 102.0, 102.5, 104.0):
            clock[0] = t
            d: Decision = await review(reader)
            out.append((t, d.allowed))
            for _ in range(3):
                await asyncio.sleep(0)
        return out

    seen: list[tuple[float, bool]] = []

    async def wrapped() -> None:
        seen.extend(await main())

    assert run_catching(wrapped) == []
    # allowed only while the 100.0 read is less than 2 s old; refused from the read ahead on
    assert all(allowed for t, allowed in seen if t < 101.5)
    assert not any(allowed for t, allowed in seen if t >= 102.0)


def test_an_answer_too_big_for_the_cache_is_enforced_and_read_every_time() -> None:
    huge = {"metadata": {"name": "pad", "annotations": {"x": "y" * QUOTA_CACHE_BYTES}},
            "spec": {"hard": {f"limits.{VGPU}": "0"}}}
    api = Api({"team": [huge]})
    reader = QuotaReader(api, CFG)

    async def main() -> None:
        for _ in range(3):
            assert not (await review(reader)).allowed
        assert api.reads == ["team"] * 3 and len(reader._quotas) == 0 and reader._reading == {}

    assert run_catching(main) == []


def test_many_namespaces_at_once_share_one_read_each_and_leave_no_reads_in_flight() -> None:
    names = [f"ns-{i}" for i in range(200)] + ["x" * 253]
    api = Api({n: ([TIGHT] if i % 2 else []) for i, n in enumerate(names)})
    reader = QuotaReader(api, CFG)

    async def main() -> None:
        api.gate.clear()
        reviews = [asyncio.ensure_future(review(reader, n)) for n in names for _ in range(3)]
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        api.gate.set()
        done = await asyncio.gather(*reviews)
        assert [d.allowed for d in done] == [not (i % 2) for i in range(len(names)) for _ in range(3)]
        assert sorted(api.reads) == sorted(names) and reader._reading == {}
        assert reader._quotas.bytes <= QUOTA_CACHE_BYTES

    assert run_catching(main) == []


def test_reads_for_many_namespaces_at_once_are_bounded() -> None:
    """Red team (2026-12-05): reviews naming many namespaces (any caller the webhook does not authenticate may
    send them) each started a read of their own; at most MAX_READS now reach the API server at once, the
    others queue (and are refused as unavailable, 503, after READ_TIMEOUT)."""
    from webhook import quotas

    async def main() -> None:
        names = [f"ns{i}" for i in range(3 * quotas.MAX_READS)]
        api = Api({n: [TIGHT] for n in names})
        api.gate.clear()
        reader = QuotaReader(api, CFG)  # type: ignore[arg-type]
        reviews = [asyncio.ensure_future(review(reader, n)) for n in names]
        for _ in range(100):
            await asyncio.sleep(0)
        assert len(api.reads) == quotas.MAX_READS
        api.gate.set()
        out = await asyncio.gather(*reviews)
        assert len(api.reads) == len(names) and all(not d.allowed for d in out)  # every quota judged

    asyncio.run(main())


def test_a_burst_in_one_namespace_is_not_held_by_the_bound_on_quota_reads() -> None:
    """Red team (third round): the bound first covered every read, the pods' too, which each review makes: a
    burst of 40 pods in one namespace with a quota had 8 refused as unavailable."""
    from webhook import quotas

    async def main() -> None:
        roomy = {"metadata": {"name": "gpu"}, "spec": {"hard": {f"limits.{VGPU}": "1000"}}}
        api = Api({"team": [roomy]})
        reader = QuotaReader(api, CFG)  # type: ignore[arg-type]
        out = await asyncio.gather(*(review(reader) for _ in range(5 * quotas.MAX_READS)))
        assert all(d.allowed for d in out), [d.message for d in out if not d.allowed][:3]

    asyncio.run(main())


def test_a_check_that_outlasts_its_deadline_is_refused_as_unavailable_saying_why(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One deadline for every read of a review (CHECK_SECONDS), inside the webhook's timeout at the API server,
    and a refusal that says what happened (a bare TimeoutError said nothing)."""
    from webhook import quotas

    monkeypatch.setattr(quotas, "CHECK_SECONDS", 0.2)

    async def main() -> None:
        api = Api({"team": [TIGHT]})
        api.gate.clear()  # the API server does not answer
        reader = QuotaReader(api, CFG)  # type: ignore[arg-type]
        d = await review(reader)
        assert not d.allowed and d.code == 503, d
        assert "did not answer within 0.2 s" in d.message, d.message
        api.gate.set()

    asyncio.run(main())
