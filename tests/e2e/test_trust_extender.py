"""Who may call the extender: kube-scheduler presents a client certificate (its extender tlsConfig),
the extender requires one signed by `extenderClientCAFile`; anyone else is refused at the handshake,
before a byte of ExtenderArgs is read. Real kube-apiserver + kube-scheduler + our roles under the
chart's identities."""

from __future__ import annotations

import asyncio
import ssl
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from deploy.local import nodes as simulated
from deploy.local.controlplane import ControlPlane
from deploy.local.pki import make_ca, make_client_cert
from deploy.local.redis import RedisServer
from deploy.local.stack import Stack
from shared.kube import Kube
from tests.e2e._trust import tls_context

pytestmark = pytest.mark.e2e

BIND = {"PodName": "nobody", "PodNamespace": "default", "PodUID": "00000000-0000-0000-0000-000000000000",
        "Node": "nowhere"}


@pytest.fixture(scope="module")
def trust_stack(control_plane: ControlPlane, redis_server: RedisServer) -> Iterator[Stack]:
    with Stack(control_plane, redis_server.empty().url, "96,160").running() as st:
        yield st


async def _bind(st: Stack, ctx: ssl.SSLContext) -> tuple[int, dict[str, object]]:
    url = f"https://127.0.0.1:{st.role('extender').port}/bind"
    async with aiohttp.ClientSession() as s, s.post(url, json=BIND, ssl=ctx,
                                                     timeout=aiohttp.ClientTimeout(total=10)) as r:
        return r.status, await r.json()


async def test_a_caller_without_a_client_certificate_is_refused(trust_stack: Stack) -> None:
    with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)):
        await _bind(trust_stack, tls_context(trust_stack, None))


async def test_a_certificate_of_another_ca_is_refused(trust_stack: Stack, tmp_path: Path) -> None:
    other = make_client_cert(make_ca("someone-else"), "intruder")
    crt, key = tmp_path / "c.crt", tmp_path / "c.key"
    crt.write_bytes(other.cert_pem)
    key.write_bytes(other.key_pem)
    with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)):
        await _bind(trust_stack, tls_context(trust_stack, (crt, key)))


async def test_kube_schedulers_certificate_is_accepted_and_pods_are_placed(trust_stack: Stack) -> None:
    pki = trust_stack.cp.pki
    status, body = await _bind(trust_stack, tls_context(trust_stack, (pki.client_crt, pki.client_key)))
    assert status == 200 and body.get("Error"), body  # authenticated: the bind itself is judged (and refused)
    kube = await Kube.create(str(trust_stack.cp.kubeconfig_path))
    try:
        tag = uuid.uuid4().hex[:6]
        node = f"s4000-trust-{tag}"
        await kube.request("POST", "/api/v1/nodes", simulated.gpu_node(node, 96, 1, labels={"trust": tag}))
        ns = f"trust-{tag}"
        await kube.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
        pod = {"metadata": {"name": "p"}, "spec": {"nodeSelector": {"trust": tag}, "containers": [
            {"name": "c", "image": "busybox", "resources": {"limits": {
                "mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "8", "mthreads.com/sgpu-core": "2"}}}]}}
        deadline = time.monotonic() + 60
        while True:  # the node reaches the ledger first
            try:
                await kube.request("POST", f"/api/v1/namespaces/{ns}/pods", pod)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
        while not (await kube.get_pod(ns, "p"))["spec"].get("nodeName"):
            assert time.monotonic() < deadline, trust_stack.logs(20)
            await asyncio.sleep(0.3)
        await kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods/p", {"gracePeriodSeconds": 0}, ok=(200, 202))
        await kube.request("DELETE", f"/api/v1/nodes/{node}", ok=(200, 202))
    finally:
        await kube.close()
