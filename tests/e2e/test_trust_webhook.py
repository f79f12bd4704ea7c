"""Who may call the webhook: the API server presents the client certificate its AdmissionConfiguration
gives it, the webhook requires one signed by `webhookClientCAFile` naming `webhookClientNames`.

A forged AdmissionReview makes a webhook list that namespace's quotas and pods with its own identity, and
its denial can disclose their use. Here nobody else gets an answer: no certificate or another CA's is
refused at the handshake, another client of the same CA (kube-scheduler's) gets 403, and a pod created
through the real kube-apiserver is still admitted and mutated. The same check narrows the extender to
kube-scheduler's certificate (`extenderClientNames`).
"""

from __future__ import annotations

import ssl
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from deploy.local.controlplane import ControlPlane
from deploy.local.pki import APISERVER_CLIENT, SCHEDULER_CLIENT, make_ca, make_client_cert
from deploy.local.redis import RedisServer
from deploy.local.stack import Stack
from shared.kube import Kube
from tests.e2e._trust import forged_review, post, slice_pod, tls_context

pytestmark = pytest.mark.e2e

@pytest.fixture(scope="module")
def webhook_stack(control_plane: ControlPlane, redis_server: RedisServer) -> Iterator[Stack]:
    with Stack(control_plane, redis_server.empty().url, "96,160").running() as st:
        yield st


async def _post(st: Stack, kind: str, path: str, body: Any, ctx: ssl.SSLContext) -> tuple[int, Any]:
    status, text = await post(f"https://127.0.0.1:{st.role(kind).port}{path}", body, ctx)
    return status, orjson.loads(text)


async def test_a_forged_review_without_the_api_servers_certificate_gets_no_answer(webhook_stack: Stack,
                                                                                 tmp_path: Path) -> None:
    other = make_client_cert(make_ca("someone-else"), APISERVER_CLIENT)  # the right name, another CA
    crt, key = tmp_path / "c.crt", tmp_path / "c.key"
    crt.write_bytes(other.cert_pem)
    key.write_bytes(other.key_pem)
    for cert in (None, (crt, key)):
        with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)):
            await _post(webhook_stack, "webhook", "/mutate", forged_review("kube-system"),
                        tls_context(webhook_stack, cert))


async def test_another_client_of_the_same_ca_is_refused_with_403(webhook_stack: Stack) -> None:
    pki = webhook_stack.cp.pki
    status, body = await _post(webhook_stack, "webhook", "/mutate", forged_review("kube-system"),
                               tls_context(webhook_stack, (pki.client_crt, pki.client_key)))
    assert status == 403, body
    assert body["message"] == (f"webhook: the client certificate names {SCHEDULER_CLIENT}; "
                               f"webhookClientNames allows {APISERVER_CLIENT}")
    # and the API server's certificate does not open the extender, which answers kube-scheduler only
    status, body = await _post(webhook_stack, "extender", "/bind", {},
                               tls_context(webhook_stack, (pki.webhook_client_crt, pki.webhook_client_key)))
    assert status == 403 and f"names {APISERVER_CLIENT}" in body["message"], body


async def test_the_api_servers_certificate_is_answered(webhook_stack: Stack) -> None:
    pki = webhook_stack.cp.pki
    status, body = await _post(webhook_stack, "webhook", "/mutate", forged_review("default"),
                               tls_context(webhook_stack, (pki.webhook_client_crt, pki.webhook_client_key)))
    assert status == 200 and body["response"]["uid"] == "forged-1" and body["response"]["allowed"], body


async def test_pods_created_through_the_api_server_are_still_admitted(webhook_stack: Stack) -> None:
    kube = await Kube.create(str(webhook_stack.cp.kubeconfig_path))
    ns = f"webhook-trust-{uuid.uuid4().hex[:6]}"
    try:
        await kube.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
        created = await kube.request("POST", f"/api/v1/namespaces/{ns}/pods", slice_pod())
        # the webhook answered the API server (failurePolicy Fail: no answer, no pod) and mutated the pod
        assert created["spec"]["schedulerName"] == "hami-scheduler", created["spec"]
    finally:
        await kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods", query={"gracePeriodSeconds": "0"},
                           ok=(200, 202, 404))
        await kube.request("DELETE", f"/api/v1/namespaces/{ns}", ok=(200, 202))
        await kube.close()
