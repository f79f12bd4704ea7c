"""What the trust tests share: TLS contexts of the harness CA, a forged AdmissionReview and a slice pod."""

from __future__ import annotations

import ssl
import uuid
from pathlib import Path
from typing import Any

import aiohttp

from deploy.local.stack import Stack

NOWHERE = "mtsched.io/no-such-node"
SLICE = {"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "8", "mthreads.com/sgpu-core": "2"}


def tls_context(st: Stack, cert: tuple[Path, Path] | None) -> ssl.SSLContext:
    """Checks the roles' certificate with the harness CA; presents `cert` (certificate, key) if given."""
    ctx = ssl.create_default_context(cafile=str(st.cp.pki.ca_crt))
    if cert is not None:
        ctx.load_cert_chain(*cert)
    return ctx


def slice_pod(name: str = "p", **meta: Any) -> dict[str, Any]:
    """A slice pod no node matches: the trust tests judge its admission; left Pending in a namespace that never
    finishes deleting (no kube-controller-manager), it must not land on a later test's node."""
    return {"metadata": {"name": name, **meta},
            "spec": {"nodeSelector": {NOWHERE: "trust-tests"},
                     "containers": [{"name": "c", "image": "busybox", "resources": {"limits": SLICE}}]}}


def forged_review(ns: str) -> dict[str, Any]:
    """An AdmissionReview as the API server sends one, from someone else (uid forged-1)."""
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "forged-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "resource": {"group": "", "version": "v1", "resource": "pods"}, "operation": "CREATE",
                        "namespace": ns, "object": slice_pod("forged", namespace=ns, uid=str(uuid.uuid4()))}}


async def post(url: str, body: Any, ctx: ssl.SSLContext) -> tuple[int, str]:
    async with aiohttp.ClientSession() as s, s.post(url, json=body, ssl=ctx,
                                                     timeout=aiohttp.ClientTimeout(total=10)) as r:
        return r.status, await r.text()
