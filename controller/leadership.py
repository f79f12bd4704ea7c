"""The extender of the leader pod hands kube-scheduler's leadership over while it cannot do its job and another
replica can (the rule: shared/domain/leadership.py). One supervised task, started before the role waits for Redis,
so that an extender cut off from Redis from its start yields as well."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

from shared.config import Config
from shared.domain.leadership import YieldView, holds, lapsed, ready_peers, yield_reason, yielded_holder
from shared.kube import Kube
from shared.serving.metrics import LEADER_YIELDS

log = logging.getLogger("mtsched")

CHECK_SECONDS = 5.0
REASON = "LeadershipYielded"


def micro_time(at: float) -> str:
    """A Lease's MicroTime (RFC 3339 with microseconds, UTC)."""
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderYield:
    def __init__(self, cfg: Config, kube: Kube, problems: Callable[[], list[str]],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.namespace, _, self.lease = cfg.leader_lease.partition("/")
        self.selector = cfg.leader_peers
        self.pod = cfg.pod_name
        self.after = float(cfg.leader_yield_seconds)
        self.kube = kube
        self.problems = problems
        self.clock = clock
        self.unready_since: float | None = None
        self.last_yield: float | None = None
        self.yields = 0

    @staticmethod
    def wanted(cfg: Config) -> bool:
        """False when the configuration leaves it off (no seconds, Lease or pod name: not the chart's sidecar)."""
        return cfg.leader_yield_seconds > 0 and bool(cfg.leader_lease) and bool(cfg.pod_name)

    @property
    def lease_path(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/{self.lease}"

    async def run(self) -> None:
        while True:
            await self.check()
            await asyncio.sleep(CHECK_SECONDS)

    async def check(self) -> str:
        """One look; the reason when it wrote the Lease over, else ""."""
        now = self.clock()
        why = self.problems()
        if not why:
            self.unready_since = None
            return ""
        if self.unready_since is None:
            self.unready_since = now
        if now - self.unready_since < self.after:
            return ""  # (no API call while it may still come back by itself)
        try:
            lease = await self.kube.request("GET", self.lease_path)
            spec = lease.setdefault("spec", {})
            holder = str(spec.get("holderIdentity") or "")
            server_now = self.kube.server_clock.now() or time.time()  # (the API server's, from this answer)
            # lapsed on this host's wall clock, the one the holder stamped renewTime with: it is this pod's
            # kube-scheduler (holds), on this host. On the API server's, a host clock behind it by more than the
            # duration made every fresh renewal look lapsed, and the leader never handed over (red team, clocks)
            if not holds(holder, self.pod) or lapsed(spec, time.time()):
                return ""  # (lapsed: its kube-scheduler is gone already, a ready replica takes it as it is)
            pods = await self.kube.request("GET", f"/api/v1/namespaces/{self.namespace}/pods",
                                           query={"labelSelector": self.selector})
            view = YieldView(now, self.unready_since, holder, self.pod, ready_peers(pods, self.pod), self.last_yield)
            reason = yield_reason(view, self.after)
            if not reason:
                return ""
            at = micro_time(server_now)
            spec.update(holderIdentity=yielded_holder(self.pod), acquireTime=at, renewTime=at,
                        leaseTransitions=int(spec.get("leaseTransitions") or 0) + 1,
                        leaseDurationSeconds=int(spec.get("leaseDurationSeconds") or 15))
            # resourceVersion as read: a renewal in between makes this a 409, and the next look tries again
            await self.kube.request("PUT", self.lease_path, lease)
        except Exception as e:  # (never raised: a failing task would itself count as unready)
            log.warning("leadership: could not read or write the Lease %s/%s or list the replicas: %s",
                        self.namespace, self.lease, e)
            return ""
        self.last_yield = now
        self.yields += 1
        LEADER_YIELDS.inc()
        message = (f"the extender {reason}: wrote the Lease {self.namespace}/{self.lease} over so that its "
                   f"kube-scheduler gives up at its renew deadline and a Ready replica takes over; why unready: "
                   + "; ".join(why))
        log.warning("leadership: %s", message)
        try:
            await self.kube.create_event({"metadata": {"name": self.pod, "namespace": self.namespace}},
                                         REASON, message, "Warning", "mtsched-extender")
        except Exception as e:
            log.warning("could not record the %s event: %s", REASON, e)
        return reason
