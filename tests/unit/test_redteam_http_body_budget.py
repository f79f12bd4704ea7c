"""What request bodies may hold of the webhook's memory (red team, 2026-12-07).

The webhook answers anyone who reaches its port unless webhookClientCAFile is set (the chart's default), and its
container has 256 MiB. A body under its 8 MiB client_max_size took far more once decoded: 8 MB of `[],` in a
review's `spec.volumes` are 2.7 million lists, and one such review took the process from 86 to 334 MiB (one request,
no concurrency); 32 reviews of 8 MB held at once (all but the last byte sent) took it to 357 MiB. Each body, from
its read until its handler ends, is now charged an upper bound of what it and its decoding take
(shared/serving/http.py json_cost); a body that could never fit one caller's share is refused 413 without being
decoded, and one past what the bodies in flight may hold, in all or from its peer address, 503 with Retry-After.
client_max_size is now the API server's own limit on a CREATE's body, 3 MiB."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import tracemalloc

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from shared.serving.http import BODY_BUDGET, JSON_BYTE_COST, BodyBudget, json_cost, serve
from tests._wait import eventually
from tests.unit._servers import MEM, VGPU, webhook_app
from webhook.server import BODY_LIMIT as WEBHOOK_BODY_LIMIT

N = 1_000_000  # bytes of each shape below
SHAPES = {
    "lists": b"[" + b",".join([b"[]"] * (N // 3)) + b"]",
    "dicts": b"[" + b",".join([b"{}"] * (N // 3)) + b"]",
    "nested dicts": b"[" + b",".join([b'{"":{}}'] * (N // 8)) + b"]",
    "one-key dicts": b"[" + b",".join([b'{"a":1}'] * (N // 8)) + b"]",
    "a dict of unique keys": b"{" + b",".join(b'"%x":null' % i for i in range(N // 10)) + b"}",
    "floats": b"[" + b",".join([b"1.5"] * (N // 4)) + b"]",
    "large integers": b"[" + b",".join([b"123456789012"] * (N // 13)) + b"]",
    "short strings": b"[" + b",".join([b'"a"'] * (N // 4)) + b"]",
    "unique strings": b"[" + b",".join(b'"%x"' % i for i in range(N // 8)) + b"]",
    "one long string": b'["' + b"a" * N + b'"]',
    "one long string beyond Latin-1": b'["' + b"a" * N + b'\\ud83d\\ude00"]',
    "booleans": b"[" + b",".join([b"true"] * (N // 5)) + b"]",
}


@pytest.mark.parametrize("shape", SHAPES)
def test_redteam_the_cost_of_a_body_bounds_the_memory_decoding_it_takes(shape: str) -> None:
    body = SHAPES[shape]
    gc.collect()
    tracemalloc.start()
    try:
        doc = orjson.loads(body)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    del doc
    # the body itself, the copy aiohttp's read makes of it, and the decoding's peak
    assert json_cost(body) >= 2 * len(body) + peak, f"{shape}: {json_cost(body)} < {2 * len(body) + peak}"


def _review(volumes: bytes) -> bytes:
    """A CREATE review of a slice pod whose `spec.volumes` is `volumes` (raw JSON)."""
    pod = {"metadata": {"name": "p", "namespace": "ns"},
           "spec": {"volumes": "@", "containers": [{"name": "c", "resources": {"limits": {VGPU: "1", MEM: "32"}}}]}}
    doc = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
           "request": {"uid": "r1", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE",
                       "namespace": "ns", "object": pod}}
    return orjson.dumps(doc).replace(b'"@"', volumes)


async def test_redteam_a_review_whose_decoding_would_take_the_webhooks_memory_is_refused_undecoded() -> None:
    body = _review(b"[" + b",".join([b"[]"] * 800_000) + b"]")  # 2.4 MB: under client_max_size (3 MiB)
    assert len(body) < WEBHOOK_BODY_LIMIT
    async with TestClient(TestServer(webhook_app())) as client:
        resp = await client.post("/mutate", data=body, headers={"Content-Type": "application/json"})
        assert resp.status == 413, await resp.text()
        error = (await resp.json())["error"]
        assert error.startswith("body: ") and "MiB" in error, error
        # a review of an ordinary size is still judged
        ok = await client.post("/mutate", data=_review(b"[]"), headers={"Content-Type": "application/json"})
        assert ok.status == 200 and (await ok.json())["response"]["allowed"] is True


async def _post(port: int, source: str, body: bytes) -> int:
    r, w = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    try:
        w.write(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                b"Connection: close\r\n\r\n%s" % (len(body), body))
        status = await asyncio.wait_for(r.readline(), 10)
        return int(status.split()[1])
    finally:
        w.close()


async def _hold(budget: BodyBudget, port: int, source: str, body: bytes) -> asyncio.StreamWriter:
    """A connection from `source` that sent `body` but its last byte, once the server charged what came."""
    before = budget.held_by(source)
    _, w = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    w.write(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body[:-1]))
    charged = before + JSON_BYTE_COST * (len(body) - 1)
    await eventually(lambda: budget.held_by(source) == charged, what="the body is charged as it comes")
    return w


async def test_redteam_bodies_held_at_once_are_bounded_in_all_and_per_peer() -> None:
    app = webhook_app()
    budget = app[BODY_BUDGET]
    runner = await serve(app, "127.0.0.1:0")
    port = runner.addresses[0][1]
    body = _review(b"[" + b",".join([b'"v"'] * 50_000) + b"]")  # ~200 KB: its cost fits a share a few times
    cost = json_cost(body)
    assert 2 * cost <= budget.per_peer
    held: list[asyncio.StreamWriter] = []
    try:
        # one peer sends its bodies but the last byte, as many as its share holds
        while budget.held_by("127.0.0.2") + cost <= budget.per_peer:
            held.append(await _hold(budget, port, "127.0.0.2", body))
            assert len(held) < 1000
        assert await _post(port, "127.0.0.2", body) == 503  # past its share: refused, not held
        assert await _post(port, "127.0.0.3", body) == 200  # another caller is still served
        # other peers hold the rest: past the budget in all, every caller is refused
        peers = iter(f"127.0.0.{i}" for i in range(4, 40))
        while budget.held + cost <= budget.limit:
            peer = next(peers)
            while budget.held + cost <= budget.limit and budget.held_by(peer) + cost <= budget.per_peer:
                held.append(await _hold(budget, port, peer, body))
        assert await _post(port, "127.0.0.3", body) == 503
        assert budget.held <= budget.limit
        for w in held:  # the held bodies end: their reviews are judged, and what they held is given back
            w.write(body[-1:])
        await eventually(lambda: budget.held == 0, what="every charge given back")
        assert await _post(port, "127.0.0.2", body) == 200
        assert await _post(port, "127.0.0.3", body) == 200
    finally:
        for w in held:
            w.close()
            with contextlib.suppress(ConnectionError):
                await w.wait_closed()
        await runner.cleanup()
