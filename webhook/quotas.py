"""Reads what the quota rule needs from the API server: the namespace's ResourceQuotas and, when one
of them uses a form only we enforce (`limits.mthreads.com/...` or the bare name), its live pods.

Every read is a quorum read (no resourceVersion=0): a stale cache would undercount what the
namespace holds. A failed read refuses the pod (fail closed). The rule is shared/domain/quota.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol
from urllib.parse import quote

from shared.config import Config
from shared.domain.admission import Decision, deny
from shared.domain.quota import QuotaError, enforced_keys, judge_quotas
from shared.serving.metrics import QUOTA_CHECKS

log = logging.getLogger("mtsched.webhook")

# The namespace's pods the API server still charges (terminal pods hold nothing).
LIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"
READ_TIMEOUT = 5.0  # well inside the webhook's own timeout at the API server


class Api(Protocol):
    async def request(self, method: str, path: str, body: Any = None, query: Mapping[str, Any] | None = None,
                      ok: tuple[int, ...] = (200, 201), content_type: str = "application/json",
                      timeout: float = 30.0) -> Any: ...


class QuotaReader:
    def __init__(self, api: Api, cfg: Config):
        self.api = api
        self.cfg = cfg
        self.keys = enforced_keys(cfg)

    async def _items(self, path: str, query: Mapping[str, str] | None = None) -> list[Mapping[str, Any]]:
        out = await self.api.request("GET", path, query=query, timeout=READ_TIMEOUT)
        items = out.get("items") if isinstance(out, dict) else None
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise QuotaError(f"GET {path}: the answer has no list of items")
        return items

    async def judge(self, namespace: str, pod: Mapping[str, Any], decision: Decision) -> Decision:
        """The decision, or a refusal when the pod exceeds a quota only we enforce (or we cannot tell)."""
        asked = dict(decision.usage)
        if not decision.allowed or not asked:
            return decision
        ns = quote(namespace, safe="")
        try:
            quotas = [q for q in await self._items(f"/api/v1/namespaces/{ns}/resourcequotas")
                      if any(k in self.keys for k in ((q.get("spec") or {}).get("hard") or {}))]
            pods: Sequence[Mapping[str, Any]] = []
            if quotas:
                pods = await self._items(f"/api/v1/namespaces/{ns}/pods", {"fieldSelector": LIVE_PODS})
            refusal = judge_quotas(pod, asked, quotas, pods, self.cfg, now=time.time())
        except Exception as e:  # fail closed: a quota we cannot check is not a quota that holds
            QUOTA_CHECKS.labels("error").inc()
            log.warning("quota check in namespace %s failed: %s", namespace, e)
            return deny(f"cannot check the ResourceQuotas of namespace {namespace}: {e}; the pod is refused "
                        "until they can be read (retry)")
        if not quotas:
            return decision
        QUOTA_CHECKS.labels("denied" if refusal else "allowed").inc()
        if refusal:
            return deny(refusal)
        return decision
