"""Runs one of our roles exactly as `mtsched <role>` does, plus fine-grained latency histograms.

The product's histograms (mtsched_extender_request_seconds, mtsched_webhook_request_seconds) have
coarse buckets (0.5, 1, 2.5, 5, 10 ms ...), good for alerting but too coarse for a p99. The load
benchmark starts the roles through this module instead of `controller.cli`, which wraps the same
handlers with histograms of 8 % wide buckets (`mtsched_bench_seconds{verb}`) and records how many
node names each filter call received (`mtsched_bench_filter_nodes`), all on the role's usual
/metrics. Nothing else differs; the product code is not changed.

  python -m bench.timed_role extender --config FILE [--set key=value ...]
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web, web_protocol
from prometheus_client import Counter, Histogram

from controller import cli, roles
from controller.extender import Extender
from shared import kube as kube_module
from shared.kube import Kube
from shared.serving import gc_policy
from shared.store.ledger import Ledger
from webhook import runner as webhook_runner
from webhook import server as webhook_server
from webhook.server import Webhook

# 50 us .. ~60 s in steps of 8 %: a quantile read from them is within 8 % of the true value
FINE_BUCKETS = tuple(round(50e-6 * 1.08**i, 9) for i in range(183))
BENCH_SECONDS = Histogram("mtsched_bench_seconds", "Handler latency with fine buckets (bench only)", ["verb"],
                          buckets=FINE_BUCKETS)
FILTER_NODES = Counter("mtsched_bench_filter_nodes", "Node names received by filter calls (bench only)")
CONNECTIONS = Counter("mtsched_bench_connections", "Connections accepted by the role's servers (bench only)")
FILTER_CALLS = Counter("mtsched_bench_filter_calls", "Filter calls whose node names were counted (bench only)")

Handler = Callable[[Any, web.Request], Awaitable[web.StreamResponse]]
RoleMain = Callable[[Any, asyncio.Event], Awaitable[None]]


def _timed(verb: str, handler: Handler) -> Handler:
    hist = BENCH_SECONDS.labels(verb)

    @functools.wraps(handler)
    async def wrapper(self: Any, request: web.Request) -> web.StreamResponse:
        start = time.perf_counter()
        try:
            return await handler(self, request)
        finally:
            hist.observe(time.perf_counter() - start)

    return wrapper


def _timed_call(verb: str, fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    hist = BENCH_SECONDS.labels(verb)

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return await fn(*args, **kwargs)
        finally:
            hist.observe(time.perf_counter() - start)

    return wrapper


def instrument() -> None:
    """Wrap the handlers (class attributes, so every instance created afterwards is timed)."""
    # every accepted connection (with TLS: one handshake each): how well callers reuse connections
    plain_made = web_protocol.RequestHandler.connection_made

    def counting_made(self: web_protocol.RequestHandler, transport: Any) -> None:
        CONNECTIONS.inc()
        plain_made(self, transport)

    web_protocol.RequestHandler.connection_made = counting_made  # type: ignore[method-assign]
    Extender.h_filter = _timed("filter", Extender.h_filter)  # type: ignore[method-assign,assignment]
    Extender.h_prioritize = _timed("prioritize", Extender.h_prioritize)  # type: ignore[method-assign,assignment]
    Extender.h_bind = _timed("bind", Extender.h_bind)  # type: ignore[method-assign,assignment]
    Webhook.h_review = _timed("webhook", Webhook.h_review)  # type: ignore[method-assign,assignment]
    # where a bind's time goes: the ledger booking, the Binding API call, the confirmation
    Ledger.place = _timed_call("bind.ledger_place", Ledger.place)  # type: ignore[method-assign,assignment]
    # one call per batch of answered binds on a node (controller/confirm.py Confirmations._confirm)
    Ledger.mark_bound_many = _timed_call("bind.ledger_mark_bound", Ledger.mark_bound_many)  # type: ignore[method-assign,assignment]
    Kube.bind = _timed_call("bind.api_binding", Kube.bind)  # type: ignore[method-assign,assignment]
    Kube.get_pod = _timed_call("bind.api_get_pod", Kube.get_pod)  # type: ignore[method-assign,assignment]
    # the verbs' own work (synchronous: no waiting for the socket or for other tasks), vs the handlers above
    plain_filter, plain_prioritize = Extender.filter, Extender.prioritize
    compute_filter, compute_prioritize = BENCH_SECONDS.labels("filter.compute"), BENCH_SECONDS.labels(
        "prioritize.compute")

    # filter.compute split: the loop thread's CPU time in it (collections included) and the collections'
    # pauses in it; what its wall time has beyond its CPU time is time the thread waited for a core
    cpu_filter, gc_filter = BENCH_SECONDS.labels("filter.compute_cpu"), BENCH_SECONDS.labels("filter.compute_gc")

    def counting_filter(self: Extender, args: Mapping[str, Any]) -> dict[str, Any]:
        FILTER_CALLS.inc()
        FILTER_NODES.inc(len(args.get("NodeNames") or []) or len((args.get("Nodes") or {}).get("items") or []))
        paused = _gc_seconds[0]
        start, cpu = time.perf_counter(), time.thread_time()
        try:
            return plain_filter(self, args)
        finally:
            compute_filter.observe(time.perf_counter() - start)
            cpu_filter.observe(time.thread_time() - cpu)
            gc_filter.observe(_gc_seconds[0] - paused)

    def timed_prioritize(self: Extender, args: Mapping[str, Any]) -> list[dict[str, Any]]:
        start = time.perf_counter()
        try:
            return plain_prioritize(self, args)
        finally:
            compute_prioritize.observe(time.perf_counter() - start)

    Extender.filter = counting_filter  # type: ignore[method-assign]
    Extender.prioritize = timed_prioritize  # type: ignore[method-assign]
    plain_review = webhook_server.judge
    compute_review = BENCH_SECONDS.labels("webhook.compute")

    def timed_review(*args: Any, **kwargs: Any) -> webhook_server.Judged | tuple[int, dict[str, Any]]:
        start = time.perf_counter()
        try:
            return plain_review(*args, **kwargs)
        finally:
            compute_review.observe(time.perf_counter() - start)

    webhook_server.judge = timed_review  # the review handlers look it up at call time


async def _lag_probe(period: float = 0.05) -> None:
    """How late the event loop runs a timer: the wait a request that just arrived would see.

    Every 50 ms (20 samples a second: 160-440 in a burst phase of 8-22 s): at 5 ms the probe itself was 6-9 % of the
    webhook's and the watcher's CPU in a burst (CPU-time sampling, docs/benchmarks.md), charged to ours."""
    hist = BENCH_SECONDS.labels("loop_lag")
    loop = asyncio.get_running_loop()
    while True:
        start = loop.time()
        await asyncio.sleep(period)
        hist.observe(max(0.0, loop.time() - start - period))


_gc_seconds = [0.0]  # every collection's pause so far, summed (what part of a filter was collecting)


def _gc_probe() -> None:
    """The product's garbage-collection pauses (shared/serving/gc_policy.py), also in fine buckets."""
    hist = {g: BENCH_SECONDS.labels(f"gc.gen{g}") for g in range(3)}

    def observe(generation: int, took: float) -> None:
        hist[generation].observe(took)
        _gc_seconds[0] += took

    gc_policy.observers.append(observe)


def _with_lag_probe(role: RoleMain) -> RoleMain:
    @functools.wraps(role)
    async def run(cfg: Any, stop: asyncio.Event) -> None:
        probe = asyncio.create_task(_lag_probe())
        try:
            await role(cfg, stop)
        finally:
            probe.cancel()

    return run


def _keep_env_lookups(api: Any) -> None:
    """Stand-in for shared.kube._read_env_once: the behaviour before that change."""


def _profile_window(path: str) -> None:
    """cProfile (by CPU time) of the event-loop thread (Python 3.11; 3.12's cProfile sees every thread) from
    SIGUSR1 to SIGUSR2, which the load benchmark
    sends at the start and end of each phase's CPU window (bench/load/phase.py): the role's per-pod work
    only, without start-up, the resyncs between phases or the benchmark's scrapes. Each window is dumped to
    ``path.<n>``."""
    import cProfile

    state: dict[str, Any] = {"prof": None, "n": 0}

    def start(*_: Any) -> None:
        stop()  # a window left open (a phase that ended early) is dumped on its own
        prof = cProfile.Profile(time.thread_time)
        prof.enable()
        state["prof"] = prof

    def stop(*_: Any) -> None:
        prof = state["prof"]
        if prof is None:
            return
        prof.disable()
        state["prof"], state["n"] = None, state["n"] + 1
        try:  # a handler runs wherever the loop's thread is: an error here would land in a request
            prof.dump_stats(f"{path}.{state['n'] - 1}")
        except Exception as e:  # said, and the next window still opens
            print(f"bench profile window: cannot write {path}.{state['n'] - 1}: {e}", file=sys.stderr, flush=True)

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)


def _sample_window(path: str, interval: float = 0.001) -> None:
    """A statistical profile by CPU time, from SIGUSR1 to SIGUSR2 (the phase's CPU window, as
    `_profile_window`): every `interval` s of the process's CPU time (ITIMER_PROF) the stack of the Python
    frame running is counted. Unlike cProfile it adds no cost per call, so many small calls are not
    inflated, and unlike py-spy it counts only time on a CPU, not time spent runnable on a saturated
    machine. Each window is dumped to ``path.<n>`` as collapsed stacks (``outer;...;inner count``, a
    flame graph's input, the format of py-spy's raw output). Python runs the handler on the main thread only:
    CPU of another thread (asyncio.to_thread, a resolver's) is counted where the loop's thread was."""
    counts: dict[str, int] = {}
    state = {"n": 0, "on": False}
    own: set[Any] = set()  # the window's own handlers' code

    def sample(_sig: int, frame: Any) -> None:
        # a tick that lands in one of the window's own handlers (another SIGPROF that came while this one was taking
        # its sample, on a loaded machine whose CPU time is accounted in lumps; a window opening or closing) is the
        # sampler's own CPU time, not the role's: not counted, or it would be added to the stack it interrupted
        if frame is not None and frame.f_code in own:
            return
        names = []
        while frame is not None:
            code = frame.f_code
            names.append(f"{code.co_qualname} ({code.co_filename}:{code.co_firstlineno})")
            frame = frame.f_back
        key = ";".join(reversed(names))
        counts[key] = counts.get(key, 0) + 1

    def start(*_: Any) -> None:
        stop()
        counts.clear()
        state["on"] = True
        signal.setitimer(signal.ITIMER_PROF, interval, interval)

    def stop(*_: Any) -> None:
        if not state["on"]:
            return
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        state["on"], state["n"] = False, state["n"] + 1
        taken = dict(counts)  # one C-level copy: a signal still pending cannot change it while it is sorted
        try:
            with open(f"{path}.{state['n'] - 1}", "w") as f:
                f.writelines(f"{k} {v}\n" for k, v in sorted(taken.items(), key=lambda kv: -kv[1]))
        except Exception as e:
            print(f"bench sample window: cannot write {path}.{state['n'] - 1}: {e}", file=sys.stderr, flush=True)

    own.update(handler.__code__ for handler in (sample, start, stop))
    signal.signal(signal.SIGPROF, sample)
    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)


def main(argv: list[str] | None = None) -> int:
    instrument()
    _gc_probe()
    if os.environ.get("MTSCHED_BENCH_TRUST_ENV") == "1":  # A/B of the change (docs/benchmarks.md)
        kube_module._read_env_once = _keep_env_lookups
    # cli.main looks them up at call time
    for module, name in ((roles, "run_extender"), (webhook_runner, "run_webhook"), (roles, "run_watcher")):
        setattr(module, name, _with_lag_probe(getattr(module, name)))
    out = os.environ.get("MTSCHED_BENCH_PROFILE")  # a path: profile this role's CPU time (cProfile) into it
    window = os.environ.get("MTSCHED_BENCH_PROFILE_WINDOW")  # a path: profile between SIGUSR1 and SIGUSR2
    if window and out:
        # one profiler at a time: the window's would end the whole-life one (3.11) or fail to start (3.12+)
        print("MTSCHED_BENCH_PROFILE and MTSCHED_BENCH_PROFILE_WINDOW exclude each other", file=sys.stderr)
        return 2
    sampled = os.environ.get("MTSCHED_BENCH_SAMPLE_WINDOW")  # a path: sample the CPU window's stacks
    if window and sampled:
        print("MTSCHED_BENCH_PROFILE_WINDOW and MTSCHED_BENCH_SAMPLE_WINDOW exclude each other", file=sys.stderr)
        return 2
    if sampled:
        _sample_window(f"{sampled}.{(argv or sys.argv[1:2])[0]}.{os.getpid()}")
    if window:
        _profile_window(f"{window}.{(argv or sys.argv[1:2])[0]}.{os.getpid()}")
    if not out:
        return cli.main(argv)
    import cProfile

    prof = cProfile.Profile(time.process_time)
    prof.enable()
    try:
        return cli.main(argv)
    finally:
        prof.disable()
        prof.dump_stats(f"{out}.{(argv or sys.argv[1:2])[0]}.{os.getpid()}")


if __name__ == "__main__":
    sys.exit(main())
