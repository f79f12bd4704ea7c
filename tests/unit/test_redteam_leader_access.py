"""Red team of the leader hand-over (controller/leadership.py) and the permission probe (shared/serving/access.py):
each test failed on the first version.

- The hand-over's own calls were missing from the extender's table of needs, so an RBAC drift that stopped it
  showed in no metric or alert.
- leaderYieldSeconds accepted 10 s, shorter than an idle replica takes to show a fault every replica shares (the
  access review every 30 s, then the kubelet's readiness probe): the leader could hand the Lease to a replica
  exactly as denied.
- A watch answered 403 did not wake the probe (only Kube.request told on_denied)."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes_asyncio import client

from controller.leadership import LeaderYield
from controller.reflector import Reflector
from shared.config import LEADER_YIELD_MIN
from shared.domain.access import needs_of
from shared.kube import Kube, ServerClock
from shared.serving.access import ACCESS_SECONDS
from tests.unit._servers import CFG

ROOT = Path(__file__).resolve().parents[2]
POD = "hami-scheduler-7d9-abcde"


class Recorder:
    """Answers one look of LeaderYield so that it writes the Lease; records (verb, resource, namespace)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []
        self.server_clock = ServerClock()

    async def request(self, method: str, path: str, body: Any = None, query: Any = None, **_: Any) -> Any:
        m = re.match(r"^/(?:api/v1|apis/[^/]+/v1)/namespaces/([^/]+)/([^/]+)(/[^/]+)?$", path)
        assert m, path
        ns, res, name = m.group(1), m.group(2), m.group(3)
        verb = {"GET": "get" if name else "list", "PUT": "update", "POST": "create"}[method]
        self.calls.append((verb, res, ns))
        if res == "leases":
            return {"metadata": {"name": "hami-scheduler", "resourceVersion": "5"},
                    "spec": {"holderIdentity": f"{POD}_uuid", "leaseDurationSeconds": 15}}
        if res == "pods":
            return {"items": [{"metadata": {"name": "peer"},
                               "status": {"conditions": [{"type": "Ready", "status": "True"}]}}]}
        return body

    async def create_event(self, pod: Any, reason: str, message: str, kind: str, component: str) -> None:
        self.calls.append(("create", "events", pod["metadata"]["namespace"]))


async def test_every_call_of_the_hand_over_is_in_the_roles_table_of_needs() -> None:
    rec = Recorder()
    cfg = dataclasses.replace(CFG, leader_yield_seconds=60, leader_lease="kube-system/hami-scheduler",
                              leader_peers="app=s", pod_name=POD)
    now = [0.0]
    y = LeaderYield(cfg, rec, lambda: ["redis: down"], clock=lambda: now[0])  # type: ignore[arg-type]
    await y.check()
    now[0] += 61
    assert await y.check()  # written over
    needs = needs_of("extender", lease=cfg.leader_lease)
    table = {(n.verb, n.resource, n.namespace) for n in needs}
    missing = sorted(c for c in set(rec.calls) if c not in table and (c[0], c[1], "") not in table)
    assert not missing, f"calls of the hand-over missing from shared/domain/access.py: {missing}"
    lease = next(n for n in needs if n.verb == "update" and n.resource == "leases")
    assert (lease.group, lease.object, lease.fatal) == ("coordination.k8s.io", "hami-scheduler", False)
    assert not [n for n in needs_of("extender") if n.resource == "leases"]  # off: not asked


def _readiness_probe_lag() -> float:
    """period x failureThreshold of the chart's readinessProbe (templates/_helpers.tpl hami.probes)."""
    text = (ROOT / "deploy/helm/hami/templates/_helpers.tpl").read_text()
    block = text[text.index("readinessProbe:", text.index('define "hami.probes"')):]
    period = re.search(r"periodSeconds:\s*(\d+)", block)
    threshold = re.search(r"failureThreshold:\s*(\d+)", block)
    assert period and threshold
    return float(int(period.group(1)) * int(threshold.group(1)))


def test_the_shortest_accepted_yield_outlasts_a_peers_detection_of_a_shared_fault() -> None:
    assert ACCESS_SECONDS + _readiness_probe_lag() <= LEADER_YIELD_MIN
    schema = (ROOT / "deploy/helm/hami/values.schema.json").read_text()
    assert f'"leaderYieldSeconds": {{"type": "integer", "anyOf": [{{"const": 0}}, {{"minimum": {LEADER_YIELD_MIN},' \
        in schema


@pytest.mark.parametrize("answer", ["status", "event"])
async def test_a_watch_answered_403_wakes_the_permission_probe(answer: str) -> None:
    seen: list[str] = []

    async def forbid(request: web.Request) -> web.StreamResponse:
        seen.append(request.query.get("watch", "list"))
        if answer == "status":
            return web.json_response({"kind": "Status", "code": 403, "reason": "Forbidden"}, status=403)
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b'{"type":"ERROR","object":{"kind":"Status","code":403,"reason":"Forbidden"}}\n')
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forbid)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    conf = client.Configuration()
    conf.host = f"http://127.0.0.1:{server.port}"
    kube = Kube(client.ApiClient(configuration=conf))
    woken: list[int] = []
    kube.on_denied.append(lambda: woken.append(1))
    try:
        r = Reflector(kube, "/api/v1/pods", lambda *_: asyncio.sleep(0), lambda *_: asyncio.sleep(0), "pods")
        r.resource_version = "1"
        task = asyncio.ensure_future(r._watch())
        for _ in range(50):  # bounded: at most 2.5 s
            await asyncio.sleep(0.05)
            if woken:
                break
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert seen and seen[0] == "true", seen  # the watch was answered 403
        assert woken, "a watch answered 403 did not wake the permission probe"
    finally:
        await kube.close()
        await server.close()
