"""Namespace quotas on slices, on the real control plane (issue 13 item 1).

An ordinary user, `tenant` (pods in its own namespace only, deploy/local/identities.py), creates
fractional, exclusive and multi-card pods against a ResourceQuota in each form:

- `requests.mthreads.com/...`: enforced by the API server's ResourceQuota admission, which runs
  after our mutating webhook, so it charges the amounts the webhook fills in (96 units for an
  exclusive pod, 2 x 96 for `vgpu: 2`). Its refusal comes from the API server itself.
- `limits.mthreads.com/...` (HAMi's documented form) and the bare name: the API server stores them
  but enforces neither for an extended resource; our webhook does (shared/domain/quota.py), with
  a refusal naming the quota, the amount asked and what is left.

The quota controller's status. The harness runs no kube-controller-manager, and the API server's
quota admission ignores a quota until `status.hard` and `status.used` are set. The test fills them
as the controller would (`sync_status`): status.hard = spec.hard, status.used = the sum, over the
namespace's non-terminal pods, of each pod's requests (the larger of its app containers' sum and
its largest init container) for the `requests.` keys the pod evaluator counts, and no used value
for keys it does not count (`limits.` and bare extended names). After that the API server keeps
`status.used` itself on every admitted pod (compare-and-swap), as in a cluster; only deletions
need the controller's recount, which `sync_status` does again. Why not run the controller: it is
one more Go build of the pinned module for CI, when all the test needs from it is this arithmetic.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio

from deploy.local.controlplane import ControlPlane
from deploy.local.redis import RedisServer
from deploy.local.stack import Stack
from shared.kube import Kube, KubeError
from tests.e2e._tenant import tenancy
from tests.e2e._wait import until

pytestmark = pytest.mark.e2e

LABEL = "mtsched.io/e2e-quota"
MEM, CORE, VGPU = "mthreads.com/sgpu-memory", "mthreads.com/sgpu-core", "mthreads.com/vgpu"
# The local stack registers our webhook under the chart's name (deploy/local/stack.py CHART_WEBHOOK_NAME).
WEBHOOK_DENIED = 'admission webhook "vgpu.hami.io" denied the request: '


def slice_(mem: int, cores: int = 1) -> dict[str, str]:
    return {VGPU: "1", MEM: str(mem), CORE: str(cores)}


EXCLUSIVE = {VGPU: "1"}  # the webhook fills in sgpu-memory 96, sgpu-core 16
MULTI = {VGPU: "2"}  # the webhook fills in 2 x 96 and 2 x 16


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane, redis_server: RedisServer) -> Iterator[Stack]:
    with Stack(control_plane, redis_server.empty().url, "96").running() as st:
        yield st


def _units(value: object) -> int:
    text = str(value)
    return int(text[:-1]) * 1000 if text.endswith("k") else int(text)


def charged(pod: Mapping[str, Any]) -> dict[str, int]:
    """What the quota controller charges a pod under `requests.<name>`: the larger of the sum of its
    app containers' requests and its largest init container's (kube's PodRequests)."""
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return {}
    spec = pod["spec"]
    out: dict[str, int] = {}
    for name in (VGPU, MEM, CORE):
        def req(c: Mapping[str, Any], n: str = name) -> int:
            return _units(((c.get("resources") or {}).get("requests") or {}).get(n, 0))

        out[f"requests.{name}"] = max(sum(req(c) for c in spec["containers"]),
                                      max((req(c) for c in spec.get("initContainers") or []), default=0))
    return out


@dataclass
class Env:
    stack: Stack
    admin: Kube
    user: Kube  # the tenant
    ns: str
    run: str

    def pod(self, name: str, limits: Mapping[str, str]) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                "spec": {"nodeSelector": {LABEL: self.run},
                         "containers": [{"name": "main", "image": "busybox", "resources": {"limits": dict(limits)}}]}}

    async def create(self, name: str, limits: Mapping[str, str]) -> dict[str, Any]:
        """Created, and returned once the API server's watch cache lists it: the webhook counts the pods it reads
        from there (resourceVersion=0, which may lag a create by moments, docs/rules.md), so the next review the
        test sends sees this pod, as the assertions expect."""
        out: dict[str, Any] = await self.user.request("POST", f"/api/v1/namespaces/{self.ns}/pods",
                                                      self.pod(name, limits))
        await until(lambda: self._cached(lambda items: any(p["metadata"]["name"] == name for p in items)),
                    f"pod {name} in the watch cache")
        return out

    async def _cached(self, ok: Any) -> bool | None:
        """Whether the namespace's pods as the watch cache lists them (the webhook's read) satisfy `ok`."""
        out = await self.admin.request("GET", f"/api/v1/namespaces/{self.ns}/pods", query={"resourceVersion": "0"})
        return True if ok(out["items"]) else None

    async def refused(self, name: str, limits: Mapping[str, str]) -> str:
        with pytest.raises(KubeError) as info:
            await self.create(name, limits)
        assert info.value.status == 403, info.value
        return str(info.value.body.get("message") if isinstance(info.value.body, dict) else info.value)

    async def quota(self, name: str, hard: Mapping[str, str], status: bool = True) -> None:
        await self.admin.request("POST", f"/api/v1/namespaces/{self.ns}/resourcequotas",
                                 {"metadata": {"name": name}, "spec": {"hard": dict(hard)}})
        if status:
            await self.sync_status(name)

    async def sync_status(self, name: str) -> dict[str, Any]:
        """Write the quota's status as kube-controller-manager's quota controller would (module docstring)."""
        path = f"/api/v1/namespaces/{self.ns}/resourcequotas/{name}"
        q = await self.admin.request("GET", path)
        pods = (await self.admin.request("GET", f"/api/v1/namespaces/{self.ns}/pods"))["items"]
        hard = q["spec"]["hard"]
        used: dict[str, int] = {k: 0 for k in hard if k.startswith("requests.")}  # the keys it counts
        for p in pods:
            for key, n in charged(p).items():
                if key in used:
                    used[key] += n
        q["status"] = {"hard": hard, "used": {k: str(v) for k, v in used.items()}}
        out: dict[str, Any] = await self.admin.request("PUT", f"{path}/status", q)
        return out

    async def used(self, name: str) -> dict[str, str]:
        q = await self.admin.request("GET", f"/api/v1/namespaces/{self.ns}/resourcequotas/{name}")
        return dict(q.get("status", {}).get("used") or {})

    async def delete_pods(self) -> None:
        await self.admin.request("DELETE", f"/api/v1/namespaces/{self.ns}/pods",
                                 query={"gracePeriodSeconds": "0"}, ok=(200, 202, 404))

        # gone from the watch cache too (the webhook's read), not only from etcd
        await until(lambda: self._cached(lambda items: not items), "the namespace's pods deleted")


@pytest_asyncio.fixture
async def env(stack: Stack) -> AsyncIterator[Env]:
    async with tenancy(stack, "quota", LABEL) as t:
        yield Env(stack, t.admin, t.user, t.ns, t.run)


async def test_requests_form_is_enforced_by_the_api_server_on_the_amounts_the_webhook_fills_in(env: Env) -> None:
    await env.quota("gpu", {f"requests.{MEM}": "192", f"requests.{CORE}": "64"})  # two S4000 cards

    exclusive = await env.create("exclusive", EXCLUSIVE)  # charged 96 / 16: what the webhook filled in
    assert exclusive["spec"]["containers"][0]["resources"]["requests"][MEM] == "96"
    assert await env.used("gpu") == {f"requests.{MEM}": "96", f"requests.{CORE}": "16"}

    msg = await env.refused("multi", MULTI)  # 2 x 96 more would be 288 of 192
    assert msg == (f'pods "multi" is forbidden: exceeded quota: gpu, requested: requests.{MEM}=192, '
                   f"used: requests.{MEM}=96, limited: requests.{MEM}=192")

    await env.create("frac-a", slice_(64, 8))
    await env.create("frac-b", slice_(32, 4))  # 96 + 64 + 32 = 192: exactly full
    assert await env.used("gpu") == {f"requests.{MEM}": "192", f"requests.{CORE}": "28"}
    msg = await env.refused("frac-c", slice_(2))
    assert msg == (f'pods "frac-c" is forbidden: exceeded quota: gpu, requested: requests.{MEM}=2, '
                   f"used: requests.{MEM}=192, limited: requests.{MEM}=192")
    msg = await env.refused("exclusive-2", EXCLUSIVE)
    assert f"requested: requests.{MEM}=96, used: requests.{MEM}=192" in msg

    # Deleting pods frees quota once the controller recounts (here: the test, as it would).
    await env.delete_pods()
    await env.sync_status("gpu")
    multi = await env.create("multi", MULTI)  # 192 of 192
    assert multi["spec"]["containers"][0]["resources"]["requests"][MEM] == "192"
    assert await env.used("gpu") == {f"requests.{MEM}": "192", f"requests.{CORE}": "32"}


async def test_limits_form_as_hami_documents_is_enforced_by_our_webhook(env: Env) -> None:
    await env.quota("hami", {f"limits.{MEM}": "192", f"limits.{CORE}": "40"})
    assert await env.used("hami") == {}  # the quota controller counts neither key: the API server cannot enforce it

    await env.create("exclusive", EXCLUSIVE)
    msg = await env.refused("multi", MULTI)
    assert msg == (WEBHOOK_DENIED + f"exceeded quota: hami, requested: limits.{CORE}=32, left: limits.{CORE}=24 "
                   "(used 16 by 1 pod, limited 40); "
                   f"exceeded quota: hami, requested: limits.{MEM}=192, left: limits.{MEM}=96 "
                   "(used 96 by 1 pod, limited 192)")

    await env.create("frac-a", slice_(64, 8))
    await env.create("frac-b", slice_(32, 4))  # 96 + 64 + 32 = 192
    msg = await env.refused("frac-c", slice_(2))
    assert msg == (WEBHOOK_DENIED + f"exceeded quota: hami, requested: limits.{MEM}=2, left: limits.{MEM}=0 "
                   "(used 192 by 3 pods, limited 192)")
    msg = await env.refused("exclusive-2", EXCLUSIVE)
    assert f"requested: limits.{MEM}=96, left: limits.{MEM}=0" in msg

    # The webhook counts the namespace's live pods: deleting them frees the quota at once.
    await env.delete_pods()
    multi = await env.create("multi", MULTI)  # 192 of 192 units, 32 of 40 core groups
    assert multi["spec"]["containers"][0]["resources"]["limits"][MEM] == "192"
    msg = await env.refused("frac-d", slice_(2, 1))
    assert msg == WEBHOOK_DENIED + (f"exceeded quota: hami, requested: limits.{MEM}=2, left: limits.{MEM}=0 "
                                    "(used 192 by 1 pod, limited 192)")


async def test_bare_form_is_enforced_by_our_webhook_and_other_pods_pass(env: Env) -> None:
    await env.quota("bare", {CORE: "3"})
    await env.create("frac-a", slice_(8, 2))
    msg = await env.refused("frac-b", slice_(8, 2))
    assert msg == WEBHOOK_DENIED + (f"exceeded quota: bare, requested: {CORE}=2, left: {CORE}=1 "
                                    "(used 2 by 1 pod, limited 3)")
    await env.create("frac-c", slice_(8, 1))  # exactly what is left
    cpu = await env.create("cpu", {"cpu": "100m"})  # no slices: the quota is not ours to judge
    assert cpu["metadata"]["name"] == "cpu"


async def test_without_the_controllers_status_the_api_server_enforces_nothing(env: Env) -> None:
    """Why the status is filled in: a quota the controller never saw does not hold (kube-apiserver's
    quota admission matches quotas on status.hard), in a cluster too if kube-controller-manager is down."""
    await env.quota("unsynced", {f"requests.{MEM}": "2"}, status=False)
    await env.create("exclusive", EXCLUSIVE)  # 96 units against a limit of 2: admitted
    await env.sync_status("unsynced")  # now the controller's numbers: used 96 of 2

    async def in_effect() -> bool | None:  # the quota admission reads quotas from an informer: it may lag the write
        try:
            await env.user.request("POST", f"/api/v1/namespaces/{env.ns}/pods", env.pod("frac", slice_(2)),
                                   query={"dryRun": "All"})
        except KubeError as e:
            return True if e.status == 403 else None
        return None

    await until(in_effect, "the written quota status in the API server's quota admission")
    msg = await env.refused("frac", slice_(2))
    assert msg == (f'pods "frac" is forbidden: exceeded quota: unsynced, requested: requests.{MEM}=2, '
                   f"used: requests.{MEM}=96, limited: requests.{MEM}=2")


async def test_the_webhook_reads_live_pods_from_the_cache_page_by_page(env: Env) -> None:
    """The pod list's query (resourceVersion=0, a field selector on status.phase, limit, continue) as the real
    API server answers it to the webhook's identity: every live pod, whether it pages or not."""
    from shared.config import load_config
    from webhook.quotas import QuotaReader

    names = {f"frac-{i}" for i in range(5)}
    for name in sorted(names):
        await env.create(name, slice_(2))
    webhook = await Kube.create(str(env.stack.kubeconfig("webhook")))
    try:
        reader = QuotaReader(webhook, load_config(env={}, flags={"memoryPerCard": "96"}), page=2)
        listed = await reader.live_pods(env.ns)
        assert {p["metadata"]["name"] for p in listed} == names
        with pytest.raises(Exception, match="more than 3 live pods"):
            await QuotaReader(webhook, reader.cfg, page=2, max_pods=3).live_pods(env.ns)
    finally:
        await webhook.close()
