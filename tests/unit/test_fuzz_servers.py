"""Fuzzing the real HTTP servers: the webhook's /mutate and the extender's /filter, /prioritize, /bind.

Both applications are served by aiohttp on 127.0.0.1 (in a thread with its own event loop) and
called over HTTP, so the whole shell is under test: body reading, decoding, validation, the
rules, encoding. Inputs are valid requests with random parts replaced (wrong types at every
level, huge numbers, long and unicode strings, deep nesting within the body limit) and random
JSON. Properties: never a 5xx; a 400 always carries an error that starts with the field it is
about; a 200 has the shape kube-scheduler or the API server expects. The example counts are
bounded so the module stays well under a minute on two cores.
"""

from __future__ import annotations

import asyncio
import copy
import http.client
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit._servers import (
    CFG,
    CORE,
    FIELD,
    MEM,
    VGPU,
    FakeKube,
    FakeLedger,
    extender,
    extender_app,
    webhook_app,
)

FUZZ = settings(max_examples=250, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# --- valid requests, to be broken ---------------------------------------------------------------

REQ = "requiredDuringSchedulingIgnoredDuringExecution"
POD: dict[str, Any] = {
    "metadata": {"name": "p-u1", "namespace": "ns", "uid": "u1",
                 "annotations": {"mtsched.io/card-memory": "160", "hami.io/gpu-scheduler-policy": "binpack"},
                 "labels": {"app": "x"}},
    "spec": {
        "schedulerName": "hami-scheduler",
        "nodeSelector": {"pool": "gpu"},
        "affinity": {"nodeAffinity": {REQ: {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]},
                                  {"key": "cards", "operator": "Gt", "values": ["1"]}],
             "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["s5k"]}]}]}}},
        "initContainers": [{"name": "init", "resources": {"limits": {VGPU: "1", MEM: "16", CORE: "2"}}}],
        "containers": [
            {"name": "c", "securityContext": {"privileged": False},
             "resources": {"limits": {VGPU: "1", MEM: "32", CORE: "8"}, "requests": {"cpu": "1"}}},
            {"name": "side", "resources": {"limits": {"cpu": "100m"}}},
        ],
    },
}
REVIEW: dict[str, Any] = {
    "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
    "request": {"uid": "r-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "operation": "CREATE", "namespace": "ns", "userInfo": {"username": "alice"},
                "dryRun": False, "object": POD},
}
ARGS: dict[str, Any] = {"Pod": POD, "Nodes": None, "NodeNames": ["s4k", "s5k", "ghost"]}
NODE_ARGS: dict[str, Any] = {"Pod": POD, "Nodes": {"items": [{"metadata": {"name": "s5k"}}]}, "NodeNames": None}
BIND: dict[str, Any] = {"PodName": "p-u1", "PodNamespace": "ns", "PodUID": "u1", "Node": "s5k"}


def paths(doc: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from paths(v, (*prefix, i))


def replace(doc: Any, path: tuple[Any, ...], value: Any, drop: bool) -> Any:
    if not path:
        return value
    out = copy.deepcopy(doc)
    target = out
    for p in path[:-1]:
        target = target[p]
    if drop and isinstance(target, dict):
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return out


LONG = st.sampled_from(["9" * 5000, "9" * 65, "1" * 64, "x" * 300, "é" * 200, "\u0000" * 10, " " * 100 + "1",
                        "𝟗𝟔", "٩٦", "1e400", "-0", "+96", "96.0", "4k", "1500m", "s5k" * 100])
LEAVES = (st.none() | st.booleans() | st.integers(-(2**80), 2**80) | st.floats(allow_nan=False, allow_infinity=False)
          | st.text(max_size=40) | LONG | st.just(10**400))
JSON = st.recursive(LEAVES, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=20), inner,
                                                                                        max_size=4), max_leaves=12)


def nested(depth: int) -> Any:
    v: Any = "deep"
    for i in range(depth):
        v = [v] if i % 2 else {"k": v}
    return v


@st.composite
def broken(draw: st.DrawFn, template: dict[str, Any]) -> Any:
    """The template with one to three parts replaced, dropped or nested deeply."""
    doc: Any = template
    for _ in range(draw(st.integers(1, 3))):
        options = list(paths(doc))
        path = draw(st.sampled_from(options))
        how = draw(st.sampled_from(["value", "value", "drop", "deep"]))
        value = nested(draw(st.integers(10, 400))) if how == "deep" else draw(JSON)
        doc = replace(doc, path, value, how == "drop")
    return doc


def body(doc: Any) -> bytes:
    # the standard library writes any int (orjson stops at 64 bits): the server must cope with them
    return json.dumps(doc, ensure_ascii=False).encode()


# --- the servers --------------------------------------------------------------------------------


@dataclass
class Served:
    extender_port: int
    webhook_port: int
    kube: FakeKube
    ledger: FakeLedger

    def post(self, port: int, path: str, data: bytes) -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)  # a hang fails, it is not timed
        try:
            conn.request("POST", path, data, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        try:
            return resp.status, orjson.loads(raw)
        except orjson.JSONDecodeError:
            return resp.status, raw.decode(errors="replace")


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    kube, ledger = FakeKube(), FakeLedger()
    kube.pods[("ns", "p-u1")] = copy.deepcopy(POD)
    kube.nodes["s5k"] = {"metadata": {"name": "s5k", "labels": {"pool": "gpu", "cards": "2"}}}
    ext = extender(CFG, kube=kube, ledger=ledger)
    loop = asyncio.new_event_loop()
    started = threading.Event()
    runners: list[web.AppRunner] = []
    ports: list[int] = []

    async def start() -> None:
        for app in (extender_app(ext), webhook_app()):
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            runners.append(runner)
            ports.append(runner.addresses[0][1])

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(30)
    try:
        yield Served(ports[0], ports[1], kube, ledger)
    finally:
        async def stop() -> None:
            for r in runners:
                await r.cleanup()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


# --- properties ---------------------------------------------------------------------------------


def check_400(out: Any) -> None:
    assert isinstance(out, dict) and set(out) == {"error"}, out
    assert FIELD.match(out["error"]) and "allowed" in out["error"], out["error"]
    assert len(out["error"]) < 20_000  # values are shown truncated


def check_review(status: int, out: Any, sent: Any) -> None:
    assert status in (200, 400), (status, out)
    if status == 400:
        check_400(out)
        return
    assert out["apiVersion"] == "admission.k8s.io/v1" and out["kind"] == "AdmissionReview"
    resp = out["response"]
    assert resp["uid"] == sent["request"]["uid"] and isinstance(resp["allowed"], bool)
    if not resp["allowed"]:
        message = resp["status"]["message"]
        assert message and not message.startswith("cannot judge"), message  # a crash in the rules


def check_extender(path: str, status: int, out: Any) -> None:
    assert status in (200, 400), (status, out)
    if status == 400:
        check_400(out)
    elif path == "/filter":
        assert isinstance(out["Error"], str)
        if not out["Error"]:
            assert isinstance(out["FailedNodes"], dict) and isinstance(out["FailedAndUnresolvableNodes"], dict)
            assert (out["NodeNames"] is None) != (out.get("Nodes") is None)
    elif path == "/prioritize":
        assert isinstance(out, list) and all(isinstance(h["Host"], str) and isinstance(h["Score"], int) for h in out)
    else:
        assert set(out) == {"Error"} and isinstance(out["Error"], str)


def test_the_templates_are_valid(served: Served) -> None:
    """The fuzzers break these: each one must work unbroken, or the properties test nothing."""
    status, out = served.post(served.webhook_port, "/mutate", body(REVIEW))
    assert status == 200 and out["response"]["allowed"] is True
    status, out = served.post(served.extender_port, "/filter", body(ARGS))
    assert status == 200 and out["NodeNames"] == ["s5k"] and out["Error"] == ""
    status, out = served.post(served.extender_port, "/filter", body(NODE_ARGS))
    assert status == 200 and out["Nodes"]["items"] == NODE_ARGS["Nodes"]["items"]
    status, out = served.post(served.extender_port, "/prioritize", body(ARGS))
    assert status == 200 and [h["Host"] for h in out] == ["s4k", "s5k", "ghost"]
    status, out = served.post(served.extender_port, "/bind", body(BIND))
    assert status == 200 and out == {"Error": ""} and served.ledger.placed[-1] == ("s5k", "u1")


@FUZZ
@given(doc=broken(REVIEW))
def test_fuzz_mutate_with_broken_reviews(served: Served, doc: Any) -> None:
    status, out = served.post(served.webhook_port, "/mutate", body(doc))
    check_review(status, out, doc)


@FUZZ
@given(doc=st.one_of(broken(ARGS), broken(NODE_ARGS)))
def test_fuzz_filter_with_broken_args(served: Served, doc: Any) -> None:
    status, out = served.post(served.extender_port, "/filter", body(doc))
    check_extender("/filter", status, out)


@FUZZ
@given(doc=broken(ARGS))
def test_fuzz_prioritize_with_broken_args(served: Served, doc: Any) -> None:
    status, out = served.post(served.extender_port, "/prioritize", body(doc))
    check_extender("/prioritize", status, out)


@FUZZ
@given(doc=broken(BIND))
def test_fuzz_bind_with_broken_args(served: Served, doc: Any) -> None:
    placed = len(served.ledger.placed)
    status, out = served.post(served.extender_port, "/bind", body(doc))
    check_extender("/bind", status, out)
    if status == 400:
        assert len(served.ledger.placed) == placed  # garbage never books anything


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(["/mutate", "/filter", "/prioritize", "/bind"]),
       data=st.one_of(JSON.map(body), st.binary(max_size=200), st.integers(1, 3000).map(lambda n: b"[" * n + b"]" * n)))
def test_fuzz_garbage_gets_400_naming_a_field(served: Served, path: str, data: bytes) -> None:
    port = served.webhook_port if path == "/mutate" else served.extender_port
    status, out = served.post(port, path, data)
    assert status == 400, (status, out)
    check_400(out)


def test_bodies_over_the_limit_get_413(served: Served) -> None:
    from controller.extender import BODY_LIMIT as EXTENDER_LIMIT
    from webhook.server import BODY_LIMIT as WEBHOOK_LIMIT

    status, out = served.post(served.webhook_port, "/mutate", b" " * (WEBHOOK_LIMIT + 1))
    assert status == 413 and f"Maximum request body size {WEBHOOK_LIMIT}" in out["error"], out
    for verb in ("/filter", "/prioritize", "/bind"):
        status, out = served.post(served.extender_port, verb, b" " * (EXTENDER_LIMIT + 1))
        assert status == 413 and out["error"].startswith("body: too large"), (verb, out)


def test_a_body_in_a_transfer_coding_other_than_chunked_is_refused(served: Served) -> None:
    """aiohttp reads `Transfer-Encoding: gzip, chunked` as plain chunks and would hand the handler the gzip bytes;
    no caller of ours codes a body, so it is refused by name (as Content-Encoding is)."""
    for port, path in ((served.webhook_port, "/mutate"), (served.extender_port, "/filter")):
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         "Transfer-Encoding: gzip, chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n".encode())
            answer = sock.recv(4096).decode()
        assert answer.startswith("HTTP/1.1 415") and "Transfer-Encoding: got 'gzip, chunked'" in answer, answer
