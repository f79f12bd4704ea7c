"""Red team: the janitor's hold ends while the pod view is re-listing after a 410 that came as an event.

f7894d6 holds the janitor while the pod stream is "unsettled" (`Reflector.unsettled`): not listed, failing, or
working for less than JANITOR_VIEW_SETTLE_SECONDS (10 s) since `live_since`. `live_since` is set by
`_working()`, which `_watch` calls as soon as a resumed watch answers HTTP 200, and it is reset only by
`_failing()`. A watch resumed after an outage longer than etcd's compaction window (5 min) is answered by the
API server's watch cache with HTTP 200 and then an `ERROR` event of code 410 ("too old resource version"):
`_working()` stamps `live_since`, `_handle` raises Gone, and `run` catches Gone and re-lists *without*
marking the view unsettled. The re-list (at 5,000 nodes the pods are hundreds of 500-item pages) and its
`on_sync` take far longer than 10 s; 10 s after the 200 the janitor sees `unsettled() == ""` and expires
pending bookings past pendingTTLSeconds while the pod view is still the pre-outage one -- precisely the
outage-then-recovery case the commit was written for (bookings whose binder died, whose records were written
during the outage and are not in the view yet).

Expected: while a re-list is in flight (after Gone, or any list) and for the settle time after its `on_sync`,
the janitor's view problem is non-empty. Fix: controller/reflector.py `Reflector.run` (reset `live_since` on
Gone / before every list, and stamp it after `on_sync`), or `_watch` (stamp `live_since` only once the first
non-ERROR event or bookmark was handled).
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from controller import watchers
from controller.reflector import Reflector
from controller.watchers import janitor_for
from shared.config import load_config

SETTLE = 0.3  # JANITOR_VIEW_SETTLE_SECONDS, shortened (read at each call)


class _Stream:
    def __init__(self, lines: list[bytes]):
        self._lines = lines

    async def iter_any(self) -> Any:
        for line in self._lines:
            yield line


class _Resp:
    def __init__(self, status: int, lines: list[bytes]):
        self.status = status
        self.content = _Stream(lines)

    async def __aenter__(self) -> _Resp:
        return self

    async def __aexit__(self, *_: Any) -> None:
        return None

    async def read(self) -> bytes:
        return b""


class Api:
    """First list: fine. First watch: the network fails (the outage). Resumed watch: HTTP 200, then ERROR 410 (the
    watch cache's answer to a compacted resourceVersion). Second list: in flight until `relisted` is set."""

    def __init__(self) -> None:
        self.lists = 0
        self.watches = 0
        self.relisting = asyncio.Event()
        self.relisted = asyncio.Event()

    async def request(self, method: str, path: str, query: Any = None, **_: Any) -> Any:
        self.lists += 1
        if self.lists >= 2:
            self.relisting.set()
            await self.relisted.wait()
        return {"items": [], "metadata": {"resourceVersion": str(100 * self.lists)}}

    async def raw(self, method: str, path: str, query: Any = None, **_: Any) -> Any:
        self.watches += 1
        if self.watches == 1:
            raise OSError("Connect call failed ('10.0.0.1', 6443)")
        gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired",
                                           "message": "too old resource version: 100 (5000)"}}
        return _Resp(200, [orjson.dumps(gone) + b"\n"])


class _Pods:
    """What janitor_for reads of the pod watcher."""

    def __init__(self, reflector: Reflector):
        self.reflector = reflector
        self.nudger = None

    async def confirm_now(self, uids: Any) -> set[str]:
        return set()

    async def api_holds(self, node: str, refs: Any) -> set[str]:
        return set()

    def saw_redis_time(self, now: int) -> None:
        return None


async def test_redteam_the_janitor_stays_held_while_the_pods_are_relisted_after_a_410_event(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watchers, "JANITOR_VIEW_SETTLE_SECONDS", SETTLE)
    api = Api()

    async def nothing(*_: Any) -> None:
        return None

    reflector = Reflector(api, "/api/v1/pods", nothing, nothing, "pods")  # type: ignore[arg-type]
    janitor = janitor_for(None, None, load_config(env={}, flags={}), _Pods(reflector))  # type: ignore[arg-type]
    task = asyncio.create_task(reflector.run())
    try:
        await asyncio.wait_for(api.relisting.wait(), 10)  # outage, resume (200 + ERROR 410), re-list in flight
        assert api.watches == 2
        await asyncio.sleep(SETTLE * 3)  # the re-list of a large cluster takes far longer than the settle time
        why = janitor.view_problem()
        relist_in_flight = not api.relisted.is_set()
    finally:
        api.relisted.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert relist_in_flight
    assert why, ("the pod stream came back from an outage with 200 + ERROR 410 and is re-listing (its view still the "
                 "pre-outage one), yet the janitor's view problem is empty: pending bookings past the TTL are expired "
                 f"(live_since stamped at the 200: {reflector.live_since}, failing_since: {reflector.failing_since})")
