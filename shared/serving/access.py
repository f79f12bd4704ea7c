"""Ask the API server, now and then, whether the role may still make its calls (the needs: shared/domain/access.py).

One SelfSubjectAccessReview per need every ACCESS_SECONDS (which every authenticated user may create), and soon
after any call of the role is answered 401/403: a revoked permission shows in the role's readiness within that
time, also where nothing fails yet (an open watch stream keeps flowing until it is opened again). A review that
cannot be made (the API server away) keeps the last answer: reachability is the other checks' business."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from shared.domain.access import Need, denial_problem, needs_of
from shared.kube import Kube, KubeError
from shared.serving.metrics import PERMISSION_DENIED
from shared.serving.supervise import Supervisor
from shared.serving.waits import within

log = logging.getLogger("mtsched")

ACCESS_SECONDS = 30.0
SOONEST_SECONDS = 2.0  # a call answered 401/403 asks again now, but not more often than this
PATH = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"


def review(need: Need) -> dict[str, Any]:
    res, _, sub = need.resource.partition("/")
    attrs: dict[str, Any] = {"verb": need.verb, "group": need.group, "resource": res}
    if sub:
        attrs["subresource"] = sub
    if need.namespace:
        attrs["namespace"] = need.namespace
    if need.object:
        attrs["name"] = need.object
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attrs}}


class AccessProbe:
    def __init__(self, kube: Kube, needs: Sequence[Need]) -> None:
        self.kube = kube
        self.needs = tuple(needs)
        self.denied: dict[Need, str] = {}  # need -> the API server's reason
        self.wake = asyncio.Event()
        kube.on_denied.append(self.wake.set)  # a call refused: ask now rather than at the next period

    def problem(self) -> str:
        """The readiness check: "" unless a fatal need is denied."""
        return denial_problem(self.denied.items())

    async def check(self) -> None:
        for need in self.needs:
            try:
                got = await self.kube.request("POST", PATH, review(need), ok=(200, 201), timeout=10.0)
            except KubeError as e:
                if e.status != 401:
                    log.debug("access review of %s failed: %s", need.name, e)
                    continue
                got = {"status": {"allowed": False, "reason": f"the API server does not accept the role's "
                                  f"credentials ({e})"}}  # (every call is refused then)
            except Exception as e:  # (not a denial: left as last known)
                log.debug("access review of %s failed: %s", need.name, e)
                continue
            status = (got.get("status") or {}) if isinstance(got, dict) else {}
            allowed = status.get("allowed") is True and status.get("denied") is not True
            reason = str(status.get("reason") or status.get("evaluationError") or "")[:300]
            was = self.denied.get(need)
            if allowed:
                if was is not None:
                    log.info("the API server allows %s again", need.name)
                self.denied.pop(need, None)
            else:
                if was is None:
                    log.warning("the API server denies %s, needed for %s%s: %s", need.name, need.why,
                                "" if need.fatal else " (the role goes on without it)", reason or "no reason given")
                self.denied[need] = reason
            PERMISSION_DENIED.labels(need.verb, need.resource).set(0 if allowed else 1)

    async def run(self) -> None:
        while True:
            self.wake.clear()
            await self.check()
            await asyncio.sleep(SOONEST_SECONDS)
            with contextlib.suppress(TimeoutError):
                await within(self.wake.wait(), ACCESS_SECONDS - SOONEST_SECONDS)


def watch_access(sup: Supervisor, kube: Kube, role: str, quota_check: bool = True, lease: str = "") -> AccessProbe:
    """The role's probe, supervised, and its readiness check (`lease`: shared/domain/access.py needs_of)."""
    probe = AccessProbe(kube, needs_of(role, quota_check, lease))
    sup.spawn("access", probe.run)
    sup.check("access", probe.problem)
    return probe
