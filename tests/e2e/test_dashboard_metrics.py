"""Every metric the Grafana dashboard and the chart's alert rules query is exported by our running roles.

The real control plane, Redis and the three roles (deploy/local/stack.py, each under its chart identity);
a few slice pods are scheduled (and one stays Pending for lack of cores, one is deleted) so the latency
histograms, the per-card gauges and the counters with labels have samples. Then each role's /metrics is
scraped and the names the dashboard's panels and variables and the rendered PrometheusRule query
(tests/deploy/_promql.py) are looked up: each must be exported, and, unless it only counts
trouble, have samples.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from controller.cli import code_digest
from deploy.local import nodes as simulated
from deploy.local.controlplane import ControlPlane
from deploy.local.redis import RedisServer
from deploy.local.stack import Stack
from shared.kube import Kube
from shared.store.ledger import scripts_digest
from tests.deploy._chart import CASES, helm_binary, objects, template
from tests.deploy._promql import (
    DASHBOARD,
    Scrape,
    dashboard_queries,
    queried_names,
    rule_queries,
)
from tests.e2e._wait import until_true

pytestmark = pytest.mark.e2e

VGPU, MEM, CORE = "mthreads.com/vgpu", "mthreads.com/sgpu-memory", "mthreads.com/sgpu-core"
LABEL = "mtsched.io/e2e-dashboard"
# Counters whose labelled series appear only when something goes wrong (or, for resumes, once a watch
# stream ends and is resumed; for coalesced and deferred, once a node changes faster than once a second):
# declared (TYPE line) but without samples on a young, healthy cluster. Everything else queried must have samples.
TROUBLE_ONLY = {"mtsched_reconcile_repairs_total", "mtsched_record_mismatch_total", "mtsched_task_failures_total",
                "mtsched_watch_resumes_total", "mtsched_watch_events_coalesced_total", "mtsched_watch_deferred_total"}


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane, redis_server: RedisServer) -> Iterator[Stack]:
    with Stack(control_plane, redis_server.empty().url, "96", settings={"reconcileSeconds": 2}).running() as st:
        yield st


def queried(pytestconfig: pytest.Config) -> dict[str, set[str]]:
    """metric name -> where the dashboard or a rule queries it (the chart rendered with both enabled)."""
    dash = json.loads(DASHBOARD.read_text())
    objs = objects(template(helm_binary(pytestconfig), CASES["monitoring"]).stdout)
    assert len(rule_queries(objs)) >= 10 and len(dashboard_queries(dash)) >= 20
    return queried_names(dash, objs)


def scrapes(stack: Stack) -> dict[str, str]:
    return {r.name: stack.metrics(r) for r in stack.roles}


async def wait_for(what: str, ok: Callable[[], Any], timeout: float = 60.0) -> Any:
    """`ok()`'s first true answer, `ok` run in a thread (it scrapes; tests/e2e/_wait.py until_true)."""
    return await until_true(lambda: asyncio.to_thread(ok), what, timeout=timeout)


def pod(name: str, run: str, cores: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeSelector": {LABEL: run}, "containers": [
                {"name": "c", "image": "busybox", "resources": {"limits": {VGPU: "1", MEM: "2", CORE: str(cores)}}}]}}


async def test_every_queried_metric_is_in_a_real_scrape(stack: Stack, pytestconfig: pytest.Config) -> None:
    names = queried(pytestconfig)
    kube = await Kube.create(str(stack.cp.kubeconfig_path))
    run = uuid.uuid4().hex[:6]
    ns, node = f"e2e-dash-{run}", f"s4000-dash-{run}"
    try:
        await kube.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
        await kube.request("POST", "/api/v1/nodes", simulated.gpu_node(node, 96, 2, labels={LABEL: run}))
        watcher = stack.role("watcher")
        await wait_for("the node's cards in the watcher's gauges",
                       lambda: f'mtsched_card_cores_limit{{device_index="1",device_type="Mthreads",'
                               f'device_uuid="{node}-mthreads-1",node="{node}"}}' in stack.metrics(watcher))
        # two 10-core slices land on the two cards (card spread); a third, created after them, fits the
        # node but no card
        for name in ("a", "b"):
            await kube.request("POST", f"/api/v1/namespaces/{ns}/pods", pod(name, run, 10))

        async def bound(name: str) -> bool:
            return bool((await kube.get_pod(ns, name))["spec"].get("nodeName"))

        deadline = time.monotonic() + 60
        while not (await bound("a") and await bound("b")):
            assert time.monotonic() < deadline, "a and b never bound: " + stack.logs(10)
            await asyncio.sleep(0.3)
        await kube.request("POST", f"/api/v1/namespaces/{ns}/pods", pod("c", run, 10))
        extender = stack.role("extender")
        failure = 'mtsched_filter_failures_total{reason="CardInsufficientCore"}'
        await wait_for("a filter failure by HAMi reason", lambda: failure in stack.metrics(extender))
        assert not await bound("c")
        await kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods/a", {"gracePeriodSeconds": 0}, ok=(200, 202))
        await wait_for("the release of a", lambda: "mtsched_releases_total{" in stack.metrics(watcher))
        # (the timestamp is set by the start-up rebuild too: a pass is what the runs counter counts)
        await wait_for("a completed reconcile pass", lambda: "mtsched_reconcile_runs_total{" in stack.metrics(watcher))
        assert any(line.startswith("mtsched_reconcile_last_pass_timestamp_seconds ") and float(line.split()[1]) > 0
                   for line in stack.metrics(watcher).splitlines())

        texts = await asyncio.to_thread(scrapes, stack)
        scrape = Scrape.parse(*texts.values())
        missing = {n: sorted(w) for n, w in names.items() if scrape.family(n) is None}
        assert not missing, f"queried but exported by no role: {missing}"
        silent = {n: sorted(w) for n, w in names.items() if n not in TROUBLE_ONLY and not scrape.has_samples(n)}
        assert not silent, f"queried, exported, but no samples after scheduling: {silent}"
        # what the joins on mtsched_role_info and the per-role alerts rely on: every role says who it is,
        # is ready and reaches Redis
        for r in stack.roles:
            lines = set(texts[r.name].splitlines())
            assert f'mtsched_role_info{{role="{r.kind}"}} 1.0' in lines, r.name
            assert "mtsched_ready 1.0" in lines and "mtsched_redis_up 1.0" in lines, r.name
            # and its release (MtschedReleasesMixed): every role of one checkout reports the same scripts and code
            build = next(s for s in lines if s.startswith("mtsched_build_info{"))
            assert f'scripts="{scripts_digest()}"' in build and f'code="{code_digest()}"' in build, build
        ext = texts[extender.name]
        assert any(s.startswith('mtsched_extender_request_seconds_count{verb="bind"} ') and float(s.split()[1]) >= 2
                   for s in ext.splitlines())
        card = f'device_uuid="{node}-mthreads-0",node="{node}"'
        assert any(s.startswith("mtsched_card_slices{") and card in s for s in texts[watcher.name].splitlines())
    finally:
        listed = await kube.request("GET", f"/api/v1/namespaces/{ns}/pods", ok=(200, 404))
        for p in (listed or {}).get("items", []):
            await kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{p['metadata']['name']}",
                               {"gracePeriodSeconds": 0}, ok=(200, 202, 404))
        await kube.request("DELETE", f"/api/v1/nodes/{node}", ok=(200, 202, 404))
        await kube.close()
