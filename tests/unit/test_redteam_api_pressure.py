"""Red team: the roles against an API server under pressure or misbehaving (a loopback stand-in, the real Kube client).

Found before the fixes (tests/unit/test_redteam_api_pressure.py, branch rt-api):

* a watch answered 200 that ends at once (no event, no bookmark: a proxy or server closing every stream) was
  opened again with no wait at all: 6,678 watch requests in 2 s, and readiness said the stream worked;
* a list whose `continue` token is answered 410 every time started over with no wait: 10,373 list requests in 2 s
  (now: twice at once, then with backoff; never raised, as a 410 would be a non-transient failure of a rebuild);
* a 200 whose body is not a JSON object (a proxy's HTML page, a body cut short without framing) or a watch line
  that is not one raised AttributeError out of the reflector: a non-transient task failure, the process exits after
  five in a row;
* the extender's fire-and-forget Events (and the watchers' mismatch and knob events) had no bound: with Event
  POSTs slow (an events etcd under pressure), 100 of them took all 64 pooled connections and every Binding
  failed with ConnectionTimeoutError without reaching the API server;
* bind's reads of the pod (before the reservation and after a Binding without an answer) waited 30 s each on a
  stalled API server: the bind answered after 38.7 s, past kube-scheduler's httpTimeout (30 s).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from aiohttp import web

import controller.extender as extender_module
from controller.reflector import LIST_RESTARTS, Reflector
from shared.domain.timing import BIND_ANSWER_SLACK_S, BIND_DEADLINE_S
from shared.kube import BEST_EFFORT_IN_FLIGHT, BadAnswer, Shed
from shared.serving.supervise import is_transient
from tests._wait import eventually
from tests.unit._api_standin import BOOKMARK, empty_list, nothing, run_for, running, serve, watches_answered
from tests.unit._servers import FakeLedger, bind_args, extender, pod

__all__ = ["serve"]  # the loopback stand-in API server (a fixture): the tests ask for it by name


async def test_a_watch_stream_that_ends_at_once_is_asked_again_with_backoff_and_is_failing(serve: Any) -> None:
    kube, api = await serve(watches_answered(b""))  # 200, ends at once
    r = Reflector(kube, "/api/v1/nodes", nothing, nothing, "nodes")
    task = await run_for(r, 2.0)
    assert task.cancelled()  # still running
    assert api.watches <= 6, api.watches  # 0.2 + 0.4 + 0.8 s of backoff (was: thousands)
    assert "stream failing" in r.problem(1.5) and "without an event" in r.problem(1.5)


async def test_a_stream_that_says_something_resets_the_backoff_and_works(serve: Any) -> None:
    many = asyncio.Event()
    streams = 0

    async def handler(req: web.Request) -> web.Response:
        nonlocal streams
        if req.query.get("watch") == "true":  # a bookmark, then the end (as at timeoutSeconds)
            streams += 1
            if streams > 20:
                many.set()
            return web.Response(body=BOOKMARK, content_type="application/json")
        return empty_list(req)

    kube, _ = await serve(handler)
    r = Reflector(kube, "/api/v1/nodes", nothing, nothing, "nodes")
    async with running(r):
        # each stream made progress, so none waits a backoff: 20 of them come long before backoffs would add up
        # to 8 s (0.2 + 0.4 + ... 10 s); a condition with a bound, not a count in a fixed time (a busy machine)
        await asyncio.wait_for(many.wait(), 8.0)
        assert r.resource_version == "9" and r.problem(0) == ""


async def test_a_continue_token_answered_410_every_time_is_not_a_tight_loop(serve: Any) -> None:
    async def handler(req: web.Request) -> web.Response:
        if "continue" in req.query:
            return web.json_response({"kind": "Status", "code": 410, "reason": "Expired",
                                      "message": "The provided continue parameter is too old"}, status=410)
        return web.json_response({"metadata": {"resourceVersion": "5", "continue": "t"},
                                  "items": [{"metadata": {"name": "n"}}]})

    kube, api = await serve(handler)
    r = Reflector(kube, "/api/v1/nodes", nothing, nothing, "nodes", page_size=1)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(2.0):
            await r.list()
    # LIST_RESTARTS at once, then 0.2 + 0.4 + 0.8 s of backoff, each jittered down to half (was: 5,186 continues
    # in 2 s)
    assert LIST_RESTARTS + 1 <= api.continues <= LIST_RESTARTS + 5, api.continues
    api.lists = 0
    await run_for(r, 2.0)
    assert api.lists <= 2 * (LIST_RESTARTS + 5), api.lists
    assert "not listed yet" in r.problem()  # (a re-list: "re-listing for Ns" after 10 s)


async def test_a_continue_token_that_expired_once_starts_the_list_over(serve: Any) -> None:
    expired = [False]

    async def handler(req: web.Request) -> web.Response:
        if "continue" in req.query:
            if not expired[0]:
                expired[0] = True
                return web.json_response({"kind": "Status", "code": 410}, status=410)
            return web.json_response({"metadata": {"resourceVersion": "6"}, "items": [{"metadata": {"name": "b"}}]})
        return web.json_response({"metadata": {"continue": "t"}, "items": [{"metadata": {"name": "a"}}]})

    kube, _ = await serve(handler)
    items, rv = await Reflector(kube, "/api/v1/nodes", nothing, nothing, "nodes").list()
    assert [i["metadata"]["name"] for i in items] == ["a", "b"] and rv == "6"


@pytest.mark.parametrize("body", [b"<html>bad gateway</html>", b"[]", b'{"items": {"a": 1}}', b'{"kind": "List", "ite'])
async def test_a_list_answered_200_without_its_object_is_a_transient_failure(serve: Any, body: bytes) -> None:
    async def handler(_: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    kube, _ = await serve(handler)
    r = Reflector(kube, "/api/v1/nodes", nothing, nothing, "nodes")
    with pytest.raises(BadAnswer) as e:
        await r.list()
    assert is_transient(e.value)
    task = await run_for(r, 0.5)
    assert task.cancelled() and "BadAnswer" in r.problem()  # retried, not ended (the supervisor's fatal path)


async def test_a_watch_line_that_is_not_an_object_is_a_resumable_failure(serve: Any) -> None:
    kube, api = await serve(watches_answered(b"[1]\n"))
    r = Reflector(kube, "/api/v1/nodes", nothing, nothing, "nodes")
    task = await run_for(r, 1.0)
    assert task.cancelled() and "not a JSON object" in r.problem(0) and api.watches <= 5


async def test_slow_events_leave_the_binding_a_connection(serve: Any) -> None:
    """100 Events on an API server that answers them in 3 s, then a Binding with its 1 s to get a connection."""
    posted: list[str] = []
    in_flight, most = [0], [0]

    async def handler(req: web.Request) -> web.Response:
        posted.append(req.path)
        if req.path.endswith("/events"):
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
            try:
                await asyncio.sleep(3)
            finally:
                in_flight[0] -= 1
        return web.json_response({}, status=201)

    kube, _ = await serve(handler)
    ext = extender(kube=kube)  # type: ignore[arg-type]
    for i in range(100):
        ext.event({"metadata": {"name": f"p{i}", "namespace": "ns", "uid": f"u{i}"}}, "FilteringFailed", f"m{i}")
    await eventually(lambda: sum(p.endswith("/events") for p in posted) >= BEST_EFFORT_IN_FLIGHT, within=10,
                     what="the first Events sent")
    assert most[0] == BEST_EFFORT_IN_FLIGHT  # never more than that at once
    await kube.bind("ns", "p", "uid", "node", {"a": "b"}, until=time.monotonic() + 4.5)  # (raised before the fix)
    # answered while every Event sent before it still waits for its 3 s answer: it did not queue behind them
    # (a condition, not a duration)
    assert ext._events and not any(task.done() for task in ext._events)
    for task in list(ext._events):
        task.cancel()
    await asyncio.gather(*ext._events, return_exceptions=True)


async def test_too_many_waiting_events_are_shed(serve: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shared.kube.BEST_EFFORT_WAITING", 3)

    answering = [0]

    async def handler(_: web.Request) -> web.Response:
        answering[0] += 1
        await asyncio.sleep(2)
        return web.json_response({}, status=201)

    kube, _ = await serve(handler)
    body = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}}
    tasks = [asyncio.create_task(kube.create_event(body, "R", "m", "Normal", "c"))
             for _ in range(BEST_EFFORT_IN_FLIGHT + 3)]
    # every task has run (the first ones reached the server; the last 3 wait for a turn)
    await eventually(lambda: answering[0] >= BEST_EFFORT_IN_FLIGHT, within=10, what="the Events in flight")
    with pytest.raises(Shed):
        await kube.create_event(body, "R", "m", "Normal", "c")
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def test_a_bind_on_a_stalled_api_server_fits_kube_schedulers_http_timeout() -> None:
    # three reads (the pod when filter ran elsewhere, the node's labels or the pod read back, the read after the
    # deadline) and the Binding with its slack, against the chart's extenderHTTPTimeout (30 s)
    assert 3 * extender_module.BIND_READ_S + BIND_DEADLINE_S + BIND_ANSWER_SLACK_S + 1.0 < 30


async def test_a_bind_on_a_stalled_api_server_answers_in_bounded_time(serve: Any,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(extender_module, "BIND_READ_S", 0.5)
    gets = [0]

    async def handler(req: web.Request) -> web.Response:
        if req.method == "GET" and "/pods/" in req.path:
            gets[0] += 1
            if gets[0] == 1:
                return web.json_response(pod("u1"))  # filter ran on another replica: read once
        await asyncio.sleep(60)  # everything else: accepted, never answered
        return web.json_response({})

    kube, _ = await serve(handler)
    ledger = FakeLedger()
    ext = extender(kube=kube, ledger=ledger)  # type: ignore[arg-type]
    ext.bind_deadline = 1.0
    t0 = time.monotonic()
    out = await ext.bind(bind_args("u1"))
    took = time.monotonic() - t0
    assert "unknown outcome" in out["Error"] and ledger.released == []  # the booking is kept, as before
    # bounded by the deadline, the slack and its reads' timeouts (a few seconds), not by the API server, which answers
    # none of them for 60 s (each read waited up to 30 s more); kube-scheduler's extenderHTTPTimeout is 30 s
    assert took < 30, took
    for task in list(ext._events):
        task.cancel()
    await asyncio.gather(*ext._events, return_exceptions=True)
