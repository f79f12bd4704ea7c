"""An ordinary user's corner of the real control plane (tests/e2e/test_quota.py, test_trust.py): a fresh
namespace, a simulated S4000 node of 4 cards labelled for the run, and API clients as the cluster admin and as
`tenant` (deploy/local/identities.py: pods in its own namespace only); the pods and the node are deleted after."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from deploy.local import nodes as simulated
from deploy.local.identities import tenant
from deploy.local.stack import Stack
from shared.kube import Kube


@dataclass
class Tenancy:
    admin: Kube
    user: Kube  # the tenant
    ns: str
    node: str
    run: str  # the node's value of the label, for the pods' nodeSelector


@contextlib.asynccontextmanager
async def tenancy(stack: Stack, name: str, label: str) -> AsyncIterator[Tenancy]:
    """Namespace e2e-`name`-<run> and node s4000-`name`-<run> (labelled `label`: <run>)."""
    cp = stack.cp
    run = uuid.uuid4().hex[:6]
    ns, node = f"e2e-{name}-{run}", f"s4000-{name}-{run}"
    admin = await Kube.create(str(cp.kubeconfig_path))
    await admin.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    await admin.request("POST", "/api/v1/nodes", simulated.gpu_node(node, 96, 4, labels={label: run}))
    ident = await asyncio.to_thread(tenant, cp, ns, stack.dir / "identities")
    user = await Kube.create(str(ident.kubeconfig))
    try:
        yield Tenancy(admin, user, ns, node, run)
    finally:
        await admin.request("DELETE", f"/api/v1/namespaces/{ns}/pods", query={"gracePeriodSeconds": "0"},
                            ok=(200, 202, 404))
        await admin.request("DELETE", f"/api/v1/nodes/{node}", ok=(200, 202, 404))
        await user.close()
        await admin.close()
