"""The client names hold behind the harness's balancer too (two replicas of a role, as in the quick start).

deploy/local/balancer.py stands in for a Service: it takes the caller's TLS and calls a replica with the
certificate of the one client the replicas admit (the API server's for the webhook, kube-scheduler's for
the extender). Checking only that the caller's certificate is of the harness CA would hand any client of
that CA the admitted name: kube-scheduler's certificate would get a forged review answered, the API
server's would reach /bind. So the balancer narrows its callers to the same names as the replicas.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deploy.local.controlplane import ControlPlane
from deploy.local.pki import APISERVER_CLIENT, SCHEDULER_CLIENT
from deploy.local.redis import RedisServer
from deploy.local.stack import Stack
from shared.kube import Kube
from tests.e2e._trust import forged_review, post, slice_pod, tls_context

pytestmark = pytest.mark.e2e

@pytest.fixture(scope="module")
def balanced(control_plane: ControlPlane, redis_server: RedisServer) -> Iterator[Stack]:
    with Stack(control_plane, redis_server.empty().url, "96,160", extenders=2, webhooks=2).running() as st:
        assert set(st.balancers) == {"extender", "webhook"}
        yield st


async def _post(st: Stack, kind: str, path: str, body: Any, cert: tuple[Path, Path]) -> tuple[int, str]:
    return await post(f"https://127.0.0.1:{st.balancers[kind][1]}{path}", body, tls_context(st, cert))


async def test_kube_schedulers_certificate_gets_no_review_answered_through_the_balancer(balanced: Stack) -> None:
    pki = balanced.cp.pki
    status, text = await _post(balanced, "webhook", "/mutate", forged_review("kube-system"),
                               (pki.client_crt, pki.client_key))
    assert status == 403 and SCHEDULER_CLIENT in text and '"response"' not in text, text


async def test_the_api_servers_certificate_does_not_reach_bind_through_the_balancer(balanced: Stack) -> None:
    pki = balanced.cp.pki
    status, text = await _post(balanced, "extender", "/bind", {}, (pki.webhook_client_crt, pki.webhook_client_key))
    assert status == 403 and APISERVER_CLIENT in text, text


async def test_the_named_callers_still_pass_the_balancer(balanced: Stack) -> None:
    pki = balanced.cp.pki
    status, text = await _post(balanced, "webhook", "/mutate", forged_review("default"),
                               (pki.webhook_client_crt, pki.webhook_client_key))
    assert status == 200 and '"uid":"forged-1"' in text, text
    status, text = await _post(balanced, "extender", "/bind", {}, (pki.client_crt, pki.client_key))
    assert status == 400 and "PodName" in text, text  # the empty bind reached a replica
    kube = await Kube.create(str(balanced.cp.kubeconfig_path))
    ns = f"balanced-trust-{uuid.uuid4().hex[:6]}"
    try:
        await kube.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
        created = await kube.request("POST", f"/api/v1/namespaces/{ns}/pods", slice_pod())
        assert created["spec"]["schedulerName"] == "hami-scheduler", created["spec"]  # admitted via the balancer
    finally:
        await kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods", query={"gracePeriodSeconds": "0"},
                           ok=(200, 202, 404))
        await kube.request("DELETE", f"/api/v1/namespaces/{ns}", ok=(200, 202))
        await kube.close()
