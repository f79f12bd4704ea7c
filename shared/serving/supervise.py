"""Supervised long-running tasks and honest readiness, shared by every role.

A role's tasks (watch streams, the mirror, the janitor, the reconciler, the Redis probe) run under
one Supervisor. A task that ends or raises is started again with backoff, and counted. Transient
errors (Redis, the API server, the network) are retried for as long as they last; the role is not
ready meanwhile (after `unready_after` seconds, so a routine reconnect does not flap the probe).
Anything else is retried `max_failures` times in a row; then the role is marked failed: /readyz
answers 503 at once, and `run()` returns so the process exits non-zero and the kubelet restarts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import re
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp
from redis import exceptions as rexc

from shared.serving.metrics import TASK_FAILURES, TASK_UP
from shared.serving.waits import within

T = TypeVar("T")

log = logging.getLogger("mtsched.supervise")

Check = Callable[[], str]  # "" when fine, else why not


class TransientError(RuntimeError):
    """An error a retry can cure (raised by our own code for conditions that pass)."""


# Redis refusals that redis-py raises as plain ResponseErrors and that end by themselves: a master with
# min-replicas-to-write and no replica in reach (NOREPLICAS, until one is back: docs/install.md asks it of every
# Sentinel data node), a script past busy-reply-threshold (BUSY, until it ends or is killed), and a Redis with
# persistence that cannot write its snapshot or AOF (MISCONF: a full, read-only or lost disk; it takes writes again
# once a save works, which it retries by itself). A script's refusal starts the same way
# (tests/redis/test_redteam_refusals_transient.py, tests/redis/test_redteam_ready_misconf.py).
REDIS_REFUSALS_THAT_END = ("NOREPLICAS ", "BUSY ", "MISCONF ")
# Redis 6.2 (EVAL no write command there) answers a write refused inside a script with the script's error, the
# refusal after its lines: "Error running script (call to f_<sha>): @user_script:404: @user_script: 404: -MISCONF
# ...", for OOM and READONLY too, which redis-py raises then as plain ResponseErrors
# (tests/redis/test_review_refusals_in_scripts_62.py); Redis 7 answers with the refusal itself.
_SCRIPT_REFUSED = re.compile(r"Error running script \(call to f_[0-9a-f]+\): (?:@user_script: ?\d+: )+-")
REDIS_SCRIPT_REFUSALS_THAT_END = (*REDIS_REFUSALS_THAT_END, "OOM ", "READONLY ")


def redis_refusal(e: rexc.ResponseError) -> tuple[str, bool]:
    """A Redis error reply's text, unwrapped from 6.2's script error ("NOREPLICAS ...", "WRONGTYPE ..."), and whether
    it was a script's (pure)."""
    message = str(e)
    if (script := _SCRIPT_REFUSED.match(message)) is not None:
        return message[script.end():], True
    return message, False


def _ends_by_itself(e: rexc.ResponseError) -> bool:
    refusal, in_script = redis_refusal(e)
    return refusal.startswith(REDIS_SCRIPT_REFUSALS_THAT_END if in_script else REDIS_REFUSALS_THAT_END)


def is_transient(e: BaseException) -> bool:
    """Errors of the parts we depend on that heal by themselves: retry them, never give up."""
    status = getattr(e, "status", None)  # KubeError (shared/kube.py): an API server's HTTP answer
    if isinstance(status, int) and not isinstance(e, aiohttp.ClientError):
        return status >= 500 or status in (408, 429)
    # a Redis full under noeviction (OOM) heals once memory is freed or raised, as a replica (READONLY) does
    # once the failover ends, and a cluster's slot once its move between shards ends (ClusterError: redis-py's
    # retries ran out, shared/store/resend.py RESEND), and a command the Redis user's ACL refuses (NOPERM) once
    # it is granted (a script's command refused: the ledger's AclRefusedError, a TransientError); a wrapper (the
    # ledger's LedgerError) is as transient as what it wraps
    return isinstance(e, (TransientError, rexc.NoPermissionError, rexc.ConnectionError, rexc.TimeoutError,
                          rexc.BusyLoadingError,
                          rexc.ReadOnlyError, rexc.OutOfMemoryError, rexc.TryAgainError, rexc.ClusterError,
                          rexc.SlotNotCoveredError, aiohttp.ClientError, TimeoutError, ConnectionError, OSError)) or (
        isinstance(e, rexc.ResponseError) and _ends_by_itself(e)) or (
        isinstance(e.__cause__, Exception) and e.__cause__ is not e and is_transient(e.__cause__))


def asked_wait(e: BaseException | None) -> float:
    """The wait the API server asked for with the answer that made `e` (or what it wraps): its Retry-After
    (shared/kube.py KubeError.retry_after, within shared/domain/throttle.py's bounds); 0 when none."""
    seen = 0
    while e is not None and seen < 8:
        asked = getattr(e, "retry_after", None)
        if isinstance(asked, int | float):
            return float(asked)
        e, seen = e.__cause__, seen + 1
    return 0.0


def backoff_delay(attempt: int, first: float = 0.2, most: float = 10.0) -> float:
    """The wait before retry `attempt` (0 = the first retry): `first`, doubling each time, at most `most`."""
    return min(most, first * (1 << min(max(attempt, 0), 30)))


def jittered(delay: float) -> float:
    """A wait between half and all of `delay`: processes that lost a server at the same moment (every watcher,
    mirror and node agent of a cluster) do not all ask it again at the same instants when it is back."""
    return delay * (0.5 + 0.5 * random.random())


class Backoff:
    """The waits of one retry loop (backoff_delay); `reset()` once a try worked, so the next failure
    waits `first` again."""

    def __init__(self, first: float = 0.2, most: float = 10.0) -> None:
        self.first, self.most, self.attempt = first, most, 0

    @property
    def delay(self) -> float:
        """What the next `sleep()` waits at most (for the log line before it; jittered: half of it at least)."""
        return backoff_delay(self.attempt, self.first, self.most)

    def reset(self) -> None:
        self.attempt = 0

    async def sleep(self, stop: asyncio.Event | None = None, after: BaseException | None = None) -> None:
        """Wait the next delay (drawn by `jittered`), or what the API server asked for when `after` (the failure)
        was answered with a Retry-After (`asked_wait`) if that is longer; with `stop`, raise Stopped as soon as it
        is set (SIGTERM during a retry loop)."""
        delay = max(jittered(self.delay), asked_wait(after))
        self.attempt += 1
        if stop is None:
            await asyncio.sleep(delay)
            return
        with contextlib.suppress(TimeoutError):
            await within(stop.wait(), delay)
        if stop.is_set():
            raise Stopped()


async def cancel_and_wait(tasks: Iterable[asyncio.Task[Any]], grace: float = 5.0,
                          resend: float = 0.5) -> set[asyncio.Task[Any]]:
    """Cancel `tasks` and wait for them to end, at most `grace` seconds, cancelling again every `resend` seconds:
    a cancel can be swallowed (docs/runbooks.md "lost cancellations"), and one never heeded must not hold whoever
    waits (a role's exit, a test's teardown). Returns the tasks still running."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    pending = {t for t in tasks if not t.done()}
    while pending:
        for t in pending:
            t.cancel()
        left = deadline - loop.time()
        if left <= 0:
            break
        _, pending = await asyncio.wait(pending, timeout=min(resend, left))
    return pending


class Stopped(Exception):
    """The role was stopped (SIGTERM) while it still waited to start; it exits 0 (controller/cli.py)."""


async def unless_stopped(work: Awaitable[T], stop: asyncio.Event) -> T:
    """`work`'s result (or its error), or Stopped as soon as `stop` is set, the work cancelled: a start step
    waiting on a server that does not answer (30 s per API call) must not hold SIGTERM past the grace
    period."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((task, stopped), return_when=asyncio.FIRST_COMPLETED)
    finally:  # also when the caller is cancelled
        stopped.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait((task,), timeout=5.0)  # bounded: a cancel the work loses is not waited for
    if not task.done() or (task.cancelled() and stop.is_set()):
        raise Stopped()
    return task.result()  # a cancellation of the work's own, nobody stopping it: its CancelledError


@dataclass
class TaskState:
    name: str
    failures: int = 0  # in a row, reset when the task has run for `healthy_after` seconds
    failing_since: float | None = None
    last_error: str = ""
    restarts: int = 0
    # runs that failed after running `healthy_after` or longer, since the last run of `proven_after` (or
    # note_ok): each such run clears `failing_since`, so without this a task that always fails slowly (a pass
    # whose API reads time out) would look healthy
    slow_failures: int = 0


@dataclass
class Supervisor:
    max_failures: int = 5
    unready_after: float = 10.0
    healthy_after: float = 5.0  # running this long without stopping clears a task's failures
    proven_after: float = 60.0  # ... and this long, its slow failures (TaskState.slow_failures)
    slow_unready: int = 3  # this many slow failures in a row make the role unready
    max_backoff: float = 10.0
    cancel_grace: float = 5.0  # `cancel()` waits this long in all for the tasks to end ...
    cancel_resend: float = 0.5  # ... cancelling them again this often
    tasks: dict[str, TaskState] = field(default_factory=dict)
    checks: dict[str, Check] = field(default_factory=dict)
    failed: asyncio.Event = field(default_factory=asyncio.Event)
    fatal: str = ""
    _running: list[asyncio.Task[None]] = field(default_factory=list)

    def spawn(self, name: str, body: Callable[[], Awaitable[None]]) -> None:
        self.tasks[name] = TaskState(name)
        self._running.append(asyncio.create_task(self._guard(name, body), name=name))

    def check(self, name: str, fn: Check) -> None:
        """A readiness condition besides the tasks' own (e.g. "the mirror is in sync")."""
        self.checks[name] = fn

    async def _guard(self, name: str, body: Callable[[], Awaitable[None]]) -> None:
        st = self.tasks[name]
        loop = asyncio.get_running_loop()
        me = asyncio.current_task()
        TASK_UP.labels(name).set(1)
        while True:
            started = loop.time()
            run = asyncio.ensure_future(body())
            # a task that has run for `healthy_after` without stopping works again: not failing any more
            healthy = loop.call_later(self.healthy_after, self._ran_a_while, name)
            proven = loop.call_later(self.proven_after, self.note_ok, name)
            try:
                # awaited directly, so a cancel of the guard reaches the body and the guard ends with it
                await run
                error: BaseException = RuntimeError("ended by itself")
            except asyncio.CancelledError:
                run.cancel()
                raise
            except Exception as e:
                error = e
            finally:
                healthy.cancel()
                proven.cancel()
            if me is not None and me.cancelling():
                raise asyncio.CancelledError  # the body swallowed our cancel and ended: do not restart it
            ran = loop.time() - started
            if ran >= self.healthy_after:
                st.failures, st.failing_since = 0, None
                st.slow_failures += 1
            st.failures += 1
            st.restarts += 1
            st.failing_since = st.failing_since or time.monotonic()
            st.last_error = f"{type(error).__name__}: {error}"[:300]
            transient = is_transient(error)
            TASK_FAILURES.labels(name, "transient" if transient else "other").inc()
            if not transient and st.failures >= self.max_failures:
                self.fatal = f"task {name} failed {st.failures} times in a row: {st.last_error}"
                log.error("%s; giving up so the process is restarted", self.fatal)
                TASK_UP.labels(name).set(0)
                self.failed.set()
                return
            # the backoff jittered, a Retry-After not (the server asked for that much)
            delay = max(jittered(backoff_delay(st.failures - 1, most=self.max_backoff)), asked_wait(error))
            log.warning("task %s stopped (%s, %s); restarting in %.1fs", name, st.last_error,
                        "transient" if transient else f"{st.failures}/{self.max_failures}", delay,
                        exc_info=error if not transient else None)
            TASK_UP.labels(name).set(0)
            await asyncio.sleep(delay)
            TASK_UP.labels(name).set(1)

    def note_ok(self, name: str) -> None:
        """The task has run `proven_after` without stopping (or a caller says it made progress): it is healthy
        again."""
        st = self.tasks.get(name)
        if st is not None:
            st.failures, st.failing_since, st.slow_failures = 0, None, 0

    def progress(self, name: str) -> Callable[[], None]:
        """What task `name` calls each time a unit of its work succeeded (a pass, a sweep, a read of the stamp):
        `note_ok`, at once. Without it a task whose round trips had timed out during a Redis freeze (slow failures)
        kept the role unready for `proven_after` (60 s) after Redis answered again, although its next unit worked
        (tests/redis/test_heal_readiness_redis_frozen.py). A task that fails slowly again and again (a pass whose
        API reads time out) completes no unit, so it calls nothing and stays a problem."""
        return lambda: self.note_ok(name)

    def _ran_a_while(self, name: str) -> None:
        """The task has run `healthy_after` without stopping: not failing now (its slow failures stay)."""
        st = self.tasks.get(name)
        if st is not None:
            st.failures, st.failing_since = 0, None

    def problems(self, but: str = "") -> list[str]:
        """Why the role cannot do its job now; empty when ready. `but`: a task whose own failures are left out (the
        watchers' upkeep asks whether the rest of the role is ready: waiting on its own failed stamp, it would
        never stamp again, and so never succeed, until the failure aged out)."""
        if self.fatal:
            return [self.fatal]
        now = time.monotonic()
        tasks = [st for st in self.tasks.values() if st.name != but]
        out = [f"task {st.name} failing for {now - st.failing_since:.0f}s: {st.last_error}"
               for st in tasks if st.failing_since is not None and now - st.failing_since >= self.unready_after]
        out += [f"task {st.name} failed {st.slow_failures} times in a row, each after running a while: "
                f"{st.last_error}" for st in tasks if st.slow_failures >= self.slow_unready]
        for name, fn in self.checks.items():
            why = fn()
            if why:  # named once: a watch stream's problem starts with its name, the check's (`pods: stream failing`)
                out.append(why if why.startswith(f"{name}: ") else f"{name}: {why}")
        return out

    async def run(self, stop: asyncio.Event) -> bool:
        """Until `stop` (True) or a task gave up (False); cancels every task on the way out."""
        waiters = [asyncio.create_task(stop.wait()), asyncio.create_task(self.failed.wait())]
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for w in waiters:
            w.cancel()
        ok = not self.failed.is_set()
        if not ok:
            await asyncio.sleep(2.0)  # let a readiness probe see the failure before we go
        await self.cancel()
        return ok

    async def cancel(self) -> list[str]:
        """Cancel every task and wait for them to end, at most `cancel_grace` seconds, cancelling again
        every `cancel_resend` seconds meanwhile: a cancel can be swallowed (redis-py 8 lost most of those
        that met a reply arriving, docs/runbooks.md "lost cancellations"), and one that is never heeded
        must not hold the process's exit. Returns (and logs) the names of the tasks still running."""
        pending = await cancel_and_wait(self._running, self.cancel_grace, self.cancel_resend)
        for t in self._running:
            if t.done() and not t.cancelled():
                t.exception()  # retrieved, so asyncio does not log it as never retrieved
        self._running.clear()
        stuck = sorted(t.get_name() for t in pending)
        if stuck:
            log.error("tasks still running %.1fs after their cancel, left behind: %s", self.cancel_grace,
                      ", ".join(stuck))
        return stuck


class Heartbeat:
    """A condition that holds while something succeeded recently (e.g. a Redis PING)."""

    def __init__(self, what: str, max_age: float):
        self.what = what
        self.max_age = max_age
        self.last = 0.0  # never confirmed (monotonic time starts at the host's boot, not at ours)
        self.error = "not checked yet"

    def ok(self) -> None:
        self.last, self.error = time.monotonic(), ""

    def fail(self, e: BaseException) -> None:
        self.error = f"{type(e).__name__}: {e}"[:300]

    def __call__(self) -> str:
        if not self.last:
            return f"{self.what} not confirmed yet" + (f" ({self.error})" if self.error else "")
        age = time.monotonic() - self.last
        if age <= self.max_age:
            return ""
        return f"{self.what} not confirmed for {age:.0f}s" + (f" ({self.error})" if self.error else "")


async def probe_loop(beat: Heartbeat, probe: Callable[[], Awaitable[object]], interval: float = 2.0) -> None:
    """Runs `probe` every `interval` seconds and records the outcome; never raises."""
    while True:
        try:
            await within(probe(), max(1.0, interval))
            beat.ok()
        except asyncio.CancelledError:
            raise
        except Exception as e:
            beat.fail(e)
        await asyncio.sleep(interval)
