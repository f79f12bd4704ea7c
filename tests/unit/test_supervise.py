"""The supervisor restarts what fails, tells readiness the truth and gives up on what no retry cures;
the watch line reader survives lines far longer than aiohttp's own limit."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import aiohttp
import pytest
from redis import exceptions as rexc

from controller.reflector import lines
from shared.kube import KubeError
from shared.serving.supervise import (
    Backoff,
    Heartbeat,
    Stopped,
    Supervisor,
    backoff_delay,
    is_transient,
    unless_stopped,
)
from shared.store.ledger_core import failed
from shared.store.redis_conn import SCRIPT_DENIED
from tests.unit._cancels import DeafTo


@pytest.mark.parametrize(("error", "transient"), [
    (rexc.ConnectionError("gone"), True),
    (rexc.TimeoutError("slow"), True),
    (rexc.ReadOnlyError("replica"), True),
    (rexc.ClusterDownError("The cluster is down"), True),
    (rexc.SlotNotCoveredError("slot 5 not covered"), True),
    (aiohttp.ClientConnectionError(), True),
    (TimeoutError(), True),
    (KubeError(503, {}, "GET"), True),
    (KubeError(429, {}, "GET"), True),
    (KubeError(403, {"message": "forbidden"}, "PATCH"), False),
    (KubeError(401, {}, "GET"), False),
    (rexc.ResponseError("BADINPUT"), False),
    (TypeError("a bug"), False),
    # an ACL refusal: cured by granting the rule, no restart (tests/redis/test_acl_user.py)
    (rexc.NoPermissionError("this user has no permissions to run the 'subscribe' command"), True),
    (failed("reserve on n1", rexc.ResponseError(f"{SCRIPT_DENIED} 'hgetall' @user_script:183")), True),
    (failed("reserve on n1", rexc.ResponseError("BADINPUT cards")), False),
])
def test_transient_errors(error: BaseException, transient: bool) -> None:
    assert is_transient(error) is transient


async def test_restarts_a_failing_task_and_gives_up_on_a_bug() -> None:
    sup = Supervisor(max_failures=3, max_backoff=0.01, unready_after=0.0)
    runs = {"flaky": 0, "bug": 0}

    async def flaky() -> None:
        runs["flaky"] += 1
        if runs["flaky"] < 3:
            raise rexc.ConnectionError("Redis went away")
        await asyncio.Event().wait()  # then runs for good

    async def bug() -> None:
        runs["bug"] += 1
        raise TypeError("never works")

    sup.spawn("flaky", flaky)
    sup.spawn("bug", bug)
    stop = asyncio.Event()
    assert await asyncio.wait_for(sup.run(stop), 10) is False  # the bug made it give up
    assert runs["bug"] == 3 and runs["flaky"] >= 3
    assert sup.problems() and "bug" in sup.problems()[0]


async def test_transient_failures_never_give_up_but_make_the_role_unready() -> None:
    sup = Supervisor(max_failures=2, max_backoff=0.01, unready_after=0.0)
    runs = 0

    async def redis_down() -> None:
        nonlocal runs
        runs += 1
        raise rexc.ConnectionError("connection refused")

    sup.spawn("watch", redis_down)
    for _ in range(500):
        if runs > 5:
            break
        await asyncio.sleep(0.01)
    assert runs > 5 and not sup.failed.is_set()
    assert any("watch" in p for p in sup.problems())
    sup.note_ok("watch")
    assert not any("watch" in p for p in sup.problems())
    await sup.cancel()



async def test_cancel_sends_the_cancel_again_to_a_task_that_swallowed_it() -> None:
    """A task that ignores the first cancel (as one awaiting a redis-py 8 reply may) ends on the re-sent
    one, and is not started again for having "ended by itself"."""
    sup = Supervisor()
    starts = 0
    deaf, ended = DeafTo(1), asyncio.Event()

    async def deaf_once() -> None:
        nonlocal starts
        starts += 1
        try:
            await deaf()
        finally:
            ended.set()

    sup.spawn("deaf-once", deaf_once)
    await asyncio.wait_for(deaf.inside.wait(), 5)
    assert await sup.cancel() == []
    assert deaf.cancels == 2 and ended.is_set() and starts == 1


async def test_cancel_leaves_behind_a_task_that_swallows_every_cancel(caplog: pytest.LogCaptureFixture) -> None:
    """cancel() returns after its grace, naming the task that never ended; the others did end."""
    sup = Supervisor(cancel_grace=1.0, cancel_resend=0.2)
    cancels = 0
    release, inside, fine_ended = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def deaf() -> None:
        nonlocal cancels
        while not release.is_set():
            inside.set()
            try:
                await release.wait()
            except asyncio.CancelledError:
                cancels += 1

    async def fine() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            fine_ended.set()

    sup.spawn("deaf", deaf)
    sup.spawn("fine", fine)
    await asyncio.wait_for(inside.wait(), 5)
    guard = next(t for t in asyncio.all_tasks() if t.get_name() == "deaf")
    stuck = await asyncio.wait_for(sup.cancel(), 10)  # a bound against a hang, far above the grace
    assert stuck == ["deaf"]
    assert cancels >= 2  # the cancel was sent again meanwhile
    assert fine_ended.is_set() and not guard.done()
    assert "deaf" in caplog.text and "fine" not in caplog.text
    release.set()  # the test's own clean-up: the body returns, and its guard ends (cancelled), not restarted
    await asyncio.wait({guard}, timeout=5)
    assert guard.cancelled()


def test_heartbeat() -> None:
    beat = Heartbeat("Redis", max_age=5)
    # never confirmed: said so, not an age counted from the host's boot (red team: "for 34914s")
    assert beat() == "Redis not confirmed yet (not checked yet)"
    beat.fail(rexc.ConnectionError("refused"))
    assert beat() == "Redis not confirmed yet (ConnectionError: refused)"
    beat.ok()
    assert beat() == ""
    beat.last -= 10
    beat.fail(rexc.ConnectionError("refused"))
    assert beat().startswith("Redis not confirmed for 10s") and "refused" in beat()


async def test_lines_of_any_length() -> None:
    big = b"x" * (3 * 1024 * 1024)  # a 3 MiB watch event: aiohttp's readline stops at 128 KiB
    payload = b'{"a":1}\n' + big + b"\n\n" + b'{"b":2}'
    reader = aiohttp.StreamReader(_Protocol(), 2**16, loop=asyncio.get_running_loop())
    for i in range(0, len(payload), 7000):
        reader.feed_data(payload[i:i + 7000])
    reader.feed_eof()
    got = [line async for line in lines(reader)]
    assert got == [b'{"a":1}', big, b"", b'{"b":2}']


async def test_lines_refuses_a_line_past_the_cap() -> None:
    reader = aiohttp.StreamReader(_Protocol(), 2**16, loop=asyncio.get_running_loop())
    reader.feed_data(b"y" * 5000)
    reader.feed_eof()
    with pytest.raises(ValueError, match="longer than"):
        _ = [line async for line in lines(reader, max_line=1000)]


class _Protocol:
    """Enough of a protocol for a StreamReader fed by hand."""

    _reading_paused = False

    def pause_reading(self, **_: object) -> None:
        pass

    def resume_reading(self, **_: object) -> None:
        pass


@pytest.mark.parametrize(("attempt", "first", "most", "delay"), [
    (0, 0.2, 10.0, 0.2),
    (1, 0.2, 10.0, 0.4),
    (3, 0.2, 10.0, 1.6),
    (6, 0.2, 10.0, 10.0),  # 12.8 capped
    (10_000, 0.2, 10.0, 10.0),  # no overflow after a long outage
    (2, 0.5, 5.0, 2.0),
    (4, 0.5, 5.0, 5.0),
])
def test_backoff_delay(attempt: int, first: float, most: float, delay: float) -> None:
    assert backoff_delay(attempt, first, most) == pytest.approx(delay)


async def test_backoff_doubles_until_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []

    async def sleep(d: float) -> None:
        slept.append(d)

    monkeypatch.setattr("shared.serving.supervise.asyncio.sleep", sleep)
    monkeypatch.setattr("shared.serving.supervise.random.random", lambda: 1.0)  # (no jitter: the whole delays)
    b = Backoff(0.5, 3.0)
    for _ in range(4):
        await b.sleep()
    b.reset()
    await b.sleep()
    assert slept == [0.5, 1.0, 2.0, 3.0, 0.5]


async def test_unless_stopped_gives_the_works_result_or_its_error() -> None:
    stop = asyncio.Event()

    async def value() -> int:
        return 7

    async def broken() -> int:
        raise ValueError("no")

    assert await unless_stopped(value(), stop) == 7
    with pytest.raises(ValueError, match="no"):
        await unless_stopped(broken(), stop)


def _hanging() -> tuple[Callable[[], Awaitable[None]], asyncio.Event, asyncio.Event]:
    """A work that waits until cancelled, with the events of its start and of its cancellation."""
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def hangs() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    return hangs, started, cancelled


async def test_unless_stopped_cancels_the_work_at_once_when_stopped() -> None:
    stop = asyncio.Event()
    hangs, started, cancelled = _hanging()
    waiting = asyncio.create_task(unless_stopped(hangs(), stop))
    await started.wait()
    stop.set()
    with pytest.raises(Stopped):
        await asyncio.wait_for(waiting, 5)
    assert cancelled.is_set()
    with pytest.raises(Stopped):  # already stopped: the work is not left running
        await unless_stopped(hangs(), stop)


async def test_unless_stopped_cancelled_itself_cancels_the_work() -> None:
    hangs, started, cancelled = _hanging()
    waiting = asyncio.create_task(unless_stopped(hangs(), asyncio.Event()))
    await started.wait()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert cancelled.is_set()


async def test_unless_stopped_without_a_stop_passes_a_cancellation_of_the_works_own_through() -> None:
    # Stopped means SIGTERM (the role exits 0, "stopped"): a work that ends cancelled by itself while
    # nobody stopped it is not that, and the caller sees the CancelledError as without unless_stopped
    stop = asyncio.Event()

    async def cancelled_inside() -> None:
        inner = asyncio.create_task(asyncio.sleep(3600))
        await asyncio.sleep(0)
        inner.cancel()
        await inner

    with pytest.raises(asyncio.CancelledError):
        await unless_stopped(cancelled_inside(), stop)
    assert not stop.is_set()


def test_a_check_is_named_once() -> None:
    """A check's problem says the check's name once: a watch stream's starts with its own name, which is its check's
    (controller/roles.py `sup.check("pods", ...)`, Reflector.problem: readiness said `pods: pods: stream failing`)."""
    sup = Supervisor()
    sup.check("pods", lambda: "pods: stream failing for 12s (ClientError: cut)")
    sup.check("mirror", lambda: "not in sync with Redis")
    sup.check("ok", lambda: "")
    assert sup.problems() == ["pods: stream failing for 12s (ClientError: cut)", "mirror: not in sync with Redis"]
