"""What each role must be allowed to do on the API server, and what it makes of a denial.

RBAC can change under a running role (an operator edits a ClusterRole or a binding, a GitOps tool prunes one): a
watch stream already open keeps flowing until it is opened again (RBAC is checked when a request starts), and a
forbidden read of a pod leaves a booking it should confirm or free as it is, for ever. The roles ask the API server
what they may do (SelfSubjectAccessReview, shared/serving/access.py) and say so: a denied `fatal` need makes the
role unready, naming it; any denied need is logged and counted (`mtsched_permission_denied`).

The table lists every call the extender, the watchers and the webhook make (tests/e2e/test_identities.py checks
the chart grants each, and that each is in its table of the chart's grants)."""

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
    object: str = ""  # one object by name (a rule with resourceNames grants no other)

    @property
    def name(self) -> str:
        what = f"{self.resource} {self.object}" if self.object else self.resource
        where = f" in namespace {self.namespace}" if self.namespace else ""
        return f"{self.verb} {what}{where}"


EXTENDER = (
    Need("create", "pods/binding", "bind: write a pod's Binding with its allocation record"),
    Need("get", "pods", "bind: read the pod again before and after its Binding"),
    Need("get", "nodes", "bind: read the node's labels"),
    Need("create", "events", "BindingFailed and FilteringFailed events on pods", fatal=False),
    Need("list", "nodes", "/debug/explain: the nodes' labels", fatal=False),
)
WATCHER = (
    Need("list", "pods", "the pod stream: every booking's truth"),
    Need("watch", "pods", "the pod stream: every booking's truth"),
    Need("get", "pods", "the reconciler and the janitor: confirm or free a booking no listed pod explains, or one "
         "past pendingTTLSeconds (kept while unread)"),
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


def hand_over(lease: str) -> tuple[Need, ...]:
    """The leader hand-over's calls (controller/leadership.py), for the Lease `<namespace>/<name>`."""
    ns, _, name = lease.partition("/")
    why = "the leader hand-over"
    return (Need("get", "leases", f"{why}: read kube-scheduler's Lease", fatal=False, namespace=ns,
                 group="coordination.k8s.io", object=name),
            Need("update", "leases", f"{why}: write it over", fatal=False, namespace=ns, group="coordination.k8s.io",
                 object=name),
            Need("list", "pods", f"{why}: whether another replica is Ready", fatal=False, namespace=ns))


def needs_of(role: str, quota_check: bool = True, lease: str = "") -> tuple[Need, ...]:
    """`lease`: the extender's hand-over is on, for this Lease (its calls are needs too)."""
    if role == "extender":
        return EXTENDER + (hand_over(lease) if lease else ())
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
