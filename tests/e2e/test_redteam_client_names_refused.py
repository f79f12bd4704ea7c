"""A pod refused because the API server's certificate is not in webhookClientNames says why (docs/runbooks.md).

Its own module: the stack it starts shares the plane's cluster-scoped parts (the webhook configuration,
kube-scheduler, the chart's identities) and the session Redis with any other stack, so no other stack may be
running (test_redteam_client_names.py keeps one for its whole module).
"""

from __future__ import annotations

import uuid

import pytest

from deploy.local.controlplane import ControlPlane
from deploy.local.pki import APISERVER_CLIENT
from deploy.local.redis import RedisServer
from deploy.local.stack import Stack
from shared.kube import Kube, KubeError
from tests.e2e._trust import slice_pod

pytestmark = pytest.mark.e2e


async def test_a_pod_refused_for_the_api_servers_name_says_why(control_plane: ControlPlane,
                                                              redis_server: RedisServer) -> None:
    """docs/runbooks.md: pods refused with the 403's names when the API server's certificate is not in
    webhookClientNames (any other body than a Status, the API server reports as "failed to call webhook:
    unknown")."""
    settings = {"webhookClientNames": ["someone-else"]}
    with Stack(control_plane, redis_server.empty().url, "96,160", settings=settings).running() as st:
        kube = await Kube.create(str(st.cp.kubeconfig_path))
        ns = f"misnamed-{uuid.uuid4().hex[:6]}"
        try:
            await kube.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
            with pytest.raises(KubeError) as e:
                await kube.request("POST", f"/api/v1/namespaces/{ns}/pods", slice_pod())
            assert (f"the client certificate names {APISERVER_CLIENT}; webhookClientNames allows someone-else"
                    in str(e.value)), e.value
        finally:
            await kube.request("DELETE", f"/api/v1/namespaces/{ns}", ok=(200, 202))
            await kube.close()
