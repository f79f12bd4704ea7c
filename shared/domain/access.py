"""What each role must be allowed to do on the API server, and what it makes of a denial.

RBAC can change under a running role (an operator edits a ClusterRole or a binding, a GitOps tool prunes one): a
watch stream already open keeps flowing until it is opened again (RBAC is checked when a request starts), and a
forbidden read of a pod leaves a booking it should confirm or free as it is, for ever. The roles ask the API server
what they may do (SelfSubjectAccessReview, shared/serving/access.py) and say so: a denied `fatal` need makes the
role unready, naming it; any denied need is logged and counted (`mtsched_permission_denied`).

The table lists every call the roles make (tests/e2e/test_identities.py checks the chart grants each)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Need:
    verb: str
    resource: str  # with its subresource after a "/", as RBAC writes it
    why: str  # what stops without it
    fatal: bool = True  # without it the role cannot do its job: unready
    namespace: str = ""  # "": every namespace (or a cluster-scoped resource)
    group: str = ""

    @property
    def name(self) -> str:
        where = f" in namespace {self.namespace}" if self.namespace else ""
        return f"{self.verb} {self.resource}{where}"


EXTENDER = (
    Need("create", "pods/binding", "bind: write a pod's Binding with its allocation record"),
    Need("get", "pods", "bind: read the pod again before and after its Binding"),
    Need("get", "nodes", "bind: read the node's labels"),
    Need("create", "events", "BindingFailed and FilteringFailed events on pods", fatal=False),
)
WATCHER = (
    Need("list", "pods", "the pod stream: every booking's truth"),
    Need("watch", "pods", "the pod stream: every booking's truth"),
    Need("get", "pods", "the reconciler: confirm or free a booking no listed pod explains"),
    Need("list", "nodes", "the node stream: every node's cards"),
    Need("watch", "nodes", "the node stream: every node's cards"),
    Need("patch", "nodes", "nudge kube-scheduler about a node where cards were freed", fatal=False),
    Need("create", "events", "NodeCardMismatch events on nodes", fatal=False, namespace="default"),
)
# (the webhook stays ready without them: it answers every review, refusing slice pods in namespaces with our quota
# forms with the reason, which says more than a webhook without endpoints would)
WEBHOOK_QUOTAS = (
    Need("list", "resourcequotas", "the quota check of pods asking for slices", fatal=False),
    Need("list", "pods", "the quota check of pods asking for slices", fatal=False),
)


def needs_of(role: str, quota_check: bool = True) -> tuple[Need, ...]:
    if role == "extender":
        return EXTENDER
    if role == "watcher":
        return WATCHER
    if role == "webhook":
        return WEBHOOK_QUOTAS if quota_check else ()
    return ()


def denial_problem(denied: Iterable[tuple[Need, str]]) -> str:
    """The readiness problem for the denied fatal needs ("" when none): each need, why, and the API server's
    reason."""
    parts = [f"{n.name} ({n.why}){': ' + reason if reason else ''}" for n, reason in denied if n.fatal]
    if not parts:
        return ""
    return "the API server denies " + "; ".join(parts) + " (check the role's RBAC: docs/runbooks.md)"
