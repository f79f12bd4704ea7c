"""Red team (API server under pressure): 429 Too Many Requests with Retry-After, as API Priority and Fairness answers
a request it turned down before handling it. Against a loopback stand-in API server and the real Kube client.

Found before the fixes (every Retry-After was ignored):

* a Binding answered 429 failed the bind at once (its booking given back, kube-scheduler's backoff for the pod)
  although the server asked for one second and the bind had four left of its deadline; so did bind's read of the pod
  (filter ran on another replica): `cannot read pod ... HTTP 429`;
* the watchers' lists and watches answered 429 with `Retry-After: 2` were asked again after 0.2 s, 0.4 s ...: the
  load that made the server throttle, sent again sooner than it asked;
* a supervised task failing on such an answer (a reconcile pass) was restarted after 0.2 s;
* Events answered 429 kept coming, each sent to be turned down again.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import pytest
from aiohttp import web

from controller.reflector import Reflector
from shared.domain.throttle import (
    RETRY_AFTER_MAX_S,
    RETRY_AFTER_MIN_S,
    retry_after_s,
    status_retry_after,
    wait_to_resend,
)
from shared.kube import KubeError, Shed
from shared.serving.supervise import Supervisor
from tests._wait import eventually
from tests.unit._api_standin import empty_list, nothing, running, serve
from tests.unit._servers import FakeLedger, bind_args, extender, pod

__all__ = ["serve"]  # the loopback stand-in API server (a fixture): the tests ask for it by name

TOO_MANY = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "TooManyRequests", "code": 429,
            "message": "too many requests, please try again later"}


def too_many(seconds: str) -> web.Response:
    return web.json_response(TOO_MANY, status=429, headers={"Retry-After": seconds})


def test_retry_after_is_read_within_bounds() -> None:
    assert retry_after_s("1") == 1.0 and retry_after_s(" 3 ") == 3.0
    assert retry_after_s("0") == RETRY_AFTER_MIN_S  # no tight loop
    assert retry_after_s("3600") == RETRY_AFTER_MAX_S
    for junk in (None, "", "soon", "-1", "nan", "Wed, 21 Oct 2026 07:28:00 GMT"):
        assert retry_after_s(junk) is None, junk
    assert wait_to_resend(429, 1.0, 4.0) == 1.0
    assert wait_to_resend(429, 5.0, 4.0) is None  # does not fit
    assert wait_to_resend(503, 1.0, 4.0) is None and wait_to_resend(429, None, 4.0) is None


async def _bind_against(serve: Any, binding: list[web.Response | None], read: list[web.Response | None]
                        ) -> tuple[dict[str, Any], list[tuple[str, float]]]:
    """One bind (its filter on another replica: the pod is read) against answers given in order, then 201s/the pod."""
    seen: list[tuple[str, float]] = []

    async def handler(req: web.Request) -> web.Response:
        seen.append((f"{req.method} {req.path}", time.monotonic()))
        queue = binding if req.path.endswith("/binding") else read
        got = queue.pop(0) if queue else None
        if got is not None:
            return got
        return web.json_response({}, status=201) if req.method == "POST" else web.json_response(pod("u1"))

    kube, _ = await serve(handler)
    ext = extender(kube=kube, ledger=FakeLedger())  # type: ignore[arg-type]
    try:
        return await ext.bind(bind_args("u1")), seen
    finally:
        for task in list(ext._events):
            task.cancel()
        await asyncio.gather(*ext._events, return_exceptions=True)
        await ext.settled(1.0)


async def test_a_binding_answered_429_is_sent_again_after_its_retry_after(serve: Any) -> None:
    out, seen = await _bind_against(serve, [too_many("1")], [])
    assert out == {"Error": ""}, out  # (was: "binding ... failed, reservation released: ... HTTP 429")
    posts = [t for what, t in seen if what.endswith("/binding")]
    assert len(posts) == 2 and posts[1] - posts[0] >= 1.0 - 0.05  # as asked, not sooner


async def test_a_binding_whose_retry_after_outlasts_its_deadline_fails_at_once(serve: Any) -> None:
    out, seen = await _bind_against(serve, [too_many("20")], [])
    assert "failed, reservation released" in out["Error"] and "429" in out["Error"]
    assert sum(what.endswith("/binding") for what, _ in seen) == 1  # not sent again 20 s later


async def test_binds_read_of_the_pod_answered_429_is_sent_again(serve: Any) -> None:
    out, seen = await _bind_against(serve, [], [too_many("1")])
    assert out == {"Error": ""}, out  # (was: "bind: cannot read pod ns/p-u1: ... HTTP 429")
    reads = [t for what, t in seen if what.startswith("GET")]
    assert len(reads) == 2 and reads[1] - reads[0] >= 1.0 - 0.05


@pytest.mark.parametrize("which", ["watch", "list"])
async def test_the_watchers_honour_retry_after(serve: Any, which: str) -> None:
    asked: list[float] = []

    async def handler(req: web.Request) -> web.Response:
        if (req.query.get("watch") == "true") == (which == "watch"):
            asked.append(time.monotonic())
            if len(asked) == 1:
                return too_many("2")
        if req.query.get("watch") == "true":
            await asyncio.sleep(30)  # then open and quiet
        return empty_list(req)

    kube, _ = await serve(handler)
    r = Reflector(kube, "/api/v1/nodes", nothing, nothing, "nodes")
    async with running(r):
        await eventually(lambda: len(asked) >= 2, within=10, what=f"the {which} asked again")
        assert asked[1] - asked[0] >= 2.0 - 0.05, asked[1] - asked[0]  # (was: 0.2 s)


async def test_a_supervised_task_answered_429_restarts_after_its_retry_after() -> None:
    starts: list[float] = []

    async def body() -> None:
        starts.append(time.monotonic())
        if len(starts) == 1:
            raise KubeError(429, TOO_MANY, "GET /api/v1/pods", retry_after=2.0)
        await asyncio.Event().wait()

    sup = Supervisor()
    sup.spawn("reconciler", body)
    try:
        await eventually(lambda: len(starts) >= 2, within=10, what="restarted")
        assert starts[1] - starts[0] >= 2.0 - 0.05, starts[1] - starts[0]  # (was: 0.2 s)
    finally:
        await sup.cancel()


async def test_events_answered_429_are_shed_while_its_retry_after_lasts(serve: Any) -> None:
    posted: list[str] = []

    async def handler(req: web.Request) -> web.Response:
        posted.append(req.path)
        return too_many("30")

    kube, _ = await serve(handler)
    body = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}}
    with pytest.raises(KubeError):
        await kube.create_event(body, "R", "m", "Normal", "c")
    with pytest.raises(Shed):  # (was: sent, and turned down again)
        await kube.create_event(body, "R", "m", "Normal", "c")
    assert len(posted) == 1
    await kube.request("GET", "/api/v1/nodes", ok=(429,))  # only best-effort requests are held back
    assert len(posted) == 2


async def test_the_webhooks_quota_read_answered_429_is_sent_again(serve: Any) -> None:
    """A pod asking for slices in a namespace with a quota of ours was refused (503 `cannot check the ResourceQuotas`)
    when the quota read was answered 429 `Retry-After: 1`, with 4 of the review's 5 s left."""
    from shared.domain.admission import decide
    from tests.unit.test_quota import CFG, MEM, hq, slice_
    from tests.unit.test_quota import pod as quota_pod
    from webhook.quotas import QuotaReader

    reads: list[float] = []

    async def handler(req: web.Request) -> web.Response:
        if req.path.endswith("/resourcequotas"):
            reads.append(time.monotonic())
            if len(reads) == 1:
                return too_many("1")
            return web.json_response({"items": [hq("gpu", **{f"limits.{MEM}": "96"})]})
        return web.json_response({"items": []})  # the namespace's pods

    kube, _ = await serve(handler)
    p = quota_pod("new", slice_(64))
    d = await QuotaReader(kube, CFG).judge("team", p, decide(p, CFG, {96}))
    assert d.allowed, d.message  # (was: "cannot check the ResourceQuotas of namespace team: ... HTTP 429")
    assert len(reads) == 2 and reads[1] - reads[0] >= 1.0 - 0.05


async def test_a_page_answered_429_is_asked_again_not_the_whole_list(serve: Any) -> None:
    """A list of three pages whose second page is answered 429 `Retry-After: 1` once: the list started over from its
    first page (under API Priority and Fairness a list of many pages then rarely came through)."""
    asked: list[str] = []

    async def handler(req: web.Request) -> web.Response:
        token = req.query.get("continue", "")
        asked.append(token or "first")
        if token == "2" and asked.count("2") == 1:
            return too_many("1")
        nxt = {"": "2", "2": "3", "3": ""}[token]
        return web.json_response({"metadata": {"resourceVersion": "7", "continue": nxt},
                                  "items": [{"metadata": {"name": f"n{token or 1}"}}]})

    kube, _ = await serve(handler)
    items, rv = await Reflector(kube, "/api/v1/nodes", nothing, nothing, "nodes", page_size=1).list()
    assert [i["metadata"]["name"] for i in items] == ["n1", "n2", "n3"] and rv == "7"
    assert asked == ["first", "2", "2", "3"], asked  # (was: a KubeError, and run() listed again from the first page)


def test_a_status_says_when_in_its_details() -> None:
    assert status_retry_after({"details": {"retryAfterSeconds": 2}}) == 2.0
    assert status_retry_after({"details": {"retryAfterSeconds": 0}}) == RETRY_AFTER_MIN_S
    assert status_retry_after({"details": {"retryAfterSeconds": 10**9}}) == RETRY_AFTER_MAX_S
    for junk in (None, "x", {}, {"details": None}, {"details": {"retryAfterSeconds": "2"}},
                 {"details": {"retryAfterSeconds": True}}, {"details": {"retryAfterSeconds": -1}}, []):
        assert status_retry_after(junk) is None, junk


@pytest.mark.parametrize("code", [429, 504])
async def test_a_watch_streams_error_event_says_when_to_resume(serve: Any, code: int) -> None:
    """A stream's ERROR event has no headers; its Status's details.retryAfterSeconds is all it says (the API server's
    504 "Too large resource version" asks for 1 s). Was: the watch was resumed after the backoff's 0.2 s."""
    asked: list[float] = []
    status = {**TOO_MANY, "code": code, "details": {"retryAfterSeconds": 2}}

    async def handler(req: web.Request) -> web.Response:
        if req.query.get("watch") != "true":
            return empty_list(req)
        asked.append(time.monotonic())
        if len(asked) == 1:
            return web.Response(body=orjson.dumps({"type": "ERROR", "object": status}) + b"\n",
                                content_type="application/json")
        await asyncio.sleep(30)  # then open and quiet
        return empty_list(req)

    kube, _ = await serve(handler)
    r = Reflector(kube, "/api/v1/nodes", nothing, nothing, "nodes")
    async with running(r):
        await eventually(lambda: len(asked) >= 2, within=10, what="the watch resumed")
        assert asked[1] - asked[0] >= 2.0 - 0.05, asked[1] - asked[0]


async def test_a_429_whose_retry_after_only_its_body_carries_is_sent_again(serve: Any) -> None:
    """A proxy that drops the Retry-After header leaves the Status's details.retryAfterSeconds: a Binding is sent
    again after it (was: failed at once, as a 429 that says nothing of when)."""
    body_only = web.json_response({**TOO_MANY, "details": {"retryAfterSeconds": 1}}, status=429)
    out, seen = await _bind_against(serve, [body_only], [])
    assert out == {"Error": ""}, out
    sent = [t for what, t in seen if what.endswith("/binding")]
    assert len(sent) == 2 and sent[1] - sent[0] >= 1.0 - 0.05, seen
