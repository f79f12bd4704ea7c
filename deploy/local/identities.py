"""The chart's identities in the local control plane: every role runs as its ServiceAccount.

From the rendered manifest (default: deploy/manifests/hami.yaml, which tests/deploy keeps equal to
a fresh chart render) this creates, as the admin, the namespaces, ServiceAccounts, (Cluster)Roles
and (Cluster)RoleBindings exactly as rendered. Nothing is added here: a permission the chart lacks
must fail a test, as it would fail in a cluster. Then it gets one token per ServiceAccount with
the TokenRequest API (the apiserver signs it with --service-account-signing-key-file, so no
kube-controller-manager is needed) and writes one kubeconfig per role.

Roles map to ServiceAccounts through the chart's Deployments: the container that runs a role names
the pod's ServiceAccount (the extender is a sidecar of kube-scheduler, so they share one).
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from deploy.local.controlplane import ApiError, ControlPlane, ControlPlaneError

MANIFEST = Path(__file__).resolve().parents[1] / "manifests" / "hami.yaml"
RBAC = "/apis/rbac.authorization.k8s.io/v1"
# Kinds applied, in dependency order (a binding's subject and role exist before it).
KINDS = ("Namespace", "ServiceAccount", "ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding")
# Our roles and kube-scheduler, each by the chart container that runs it.
ROLE_CONTAINERS = {"kube-scheduler": "kube-scheduler", "extender": "extender", "webhook": "webhook",
                   "watcher": "watcher"}
# Long enough for a kept demo or a long benchmark; tokens are never refreshed.
TOKEN_SECONDS = 24 * 3600
# RBAC changes reach the authorizer through an informer: new bindings take a moment to apply.
EFFECTIVE_TIMEOUT = 15.0

Json = dict[str, Any]


@dataclass(frozen=True)
class Identity:
    role: str
    namespace: str
    service_account: str
    kubeconfig: Path

    @property
    def username(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"


@dataclass(frozen=True)
class Identities:
    roles: Mapping[str, Identity]
    applied: tuple[tuple[str, str], ...]  # (kind, API path) of every object applied, in creation order

    def __getitem__(self, role: str) -> Identity:
        return self.roles[role]


def load_manifest(path: Path = MANIFEST) -> list[Json]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def role_service_accounts(objs: Sequence[Json]) -> dict[str, tuple[str, str]]:
    """role -> (namespace, ServiceAccount) of the Deployment whose pod runs the role's container."""
    out: dict[str, tuple[str, str]] = {}
    for d in objs:
        if d.get("kind") != "Deployment":
            continue
        spec = d["spec"]["template"]["spec"]
        names = {c["name"] for c in spec.get("containers", [])}
        for role, container in ROLE_CONTAINERS.items():
            if container in names:
                out[role] = (d["metadata"]["namespace"], spec.get("serviceAccountName") or "default")
    missing = sorted(set(ROLE_CONTAINERS) - set(out))
    if missing:
        raise ControlPlaneError(f"the manifest has no Deployment running {', '.join(missing)}")
    return out


def _collection(obj: Json) -> str:
    kind, ns = obj["kind"], obj["metadata"].get("namespace")
    if kind == "Namespace":
        return "/api/v1/namespaces"
    if kind == "ServiceAccount":
        return f"/api/v1/namespaces/{ns}/serviceaccounts"
    plural = kind.lower() + "s"
    return f"{RBAC}/namespaces/{ns}/{plural}" if kind in ("Role", "RoleBinding") else f"{RBAC}/{plural}"


def _path(obj: Json) -> str:
    return f"{_collection(obj)}/{obj['metadata']['name']}"


def _create_or_replace(cp: ControlPlane, obj: Json) -> None:
    try:
        cp.api("POST", _collection(obj), obj)
        return
    except ApiError as e:
        if e.status != 409:
            raise
    # Already there (a stack that did not stop cleanly): replace it with the rendered object.
    path = _path(obj)
    current = cp.api("GET", path)
    cp.api("PUT", path, {**obj, "metadata": {**obj["metadata"],
                                             "resourceVersion": current["metadata"]["resourceVersion"]}})


def apply_rbac(cp: ControlPlane, objs: Sequence[Json]) -> list[Json]:
    """Create (or replace) the manifest's namespaces, ServiceAccounts and RBAC objects, as rendered."""
    chosen = sorted((o for o in objs if o.get("kind") in KINDS), key=lambda o: KINDS.index(o["kind"]))
    namespaces = {o["metadata"]["namespace"] for o in chosen if o["metadata"].get("namespace")}
    declared = {o["metadata"]["name"] for o in chosen if o["kind"] == "Namespace"}
    for ns in sorted(namespaces - declared):  # e.g. kube-system: exists already, or created here
        cp.api("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
               ok=(201, 409))
    for obj in chosen:
        _create_or_replace(cp, obj)
    return chosen


def _first_attributes(rule: Json, namespace: str | None) -> Json:
    """SubjectAccessReview attributes for the first verb/group/resource a rule grants."""
    if rule.get("nonResourceURLs"):
        return {"nonResourceAttributes": {"path": rule["nonResourceURLs"][0], "verb": rule["verbs"][0]}}
    resource, _, sub = rule["resources"][0].partition("/")
    attrs: Json = {"verb": rule["verbs"][0], "group": rule.get("apiGroups", [""])[0], "resource": resource}
    if sub:
        attrs["subresource"] = sub
    if rule.get("resourceNames"):
        attrs["name"] = rule["resourceNames"][0]
    if namespace:
        attrs["namespace"] = namespace
    return {"resourceAttributes": attrs}


def can(cp: ControlPlane, user: str, attributes: Json) -> bool:
    """SubjectAccessReview (asked as the admin): may `user` (a ServiceAccount) do this?"""
    ns_sa = user.removeprefix("system:serviceaccount:").split(":")[0]
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
              "spec": {"user": user, "groups": ["system:serviceaccounts", f"system:serviceaccounts:{ns_sa}",
                                                "system:authenticated"], **attributes}}
    out = cp.api("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
    return bool(out["status"].get("allowed"))


def wait_effective(cp: ControlPlane, bindings: Iterable[Json], timeout: float = EFFECTIVE_TIMEOUT) -> None:
    """Return once every binding grants its subjects the first rule of its role, so roles started
    next never see a transient 403 while the authorizer's informer catches up."""
    checks: list[tuple[str, Json]] = []
    for b in bindings:
        ref, ns = b["roleRef"], b["metadata"].get("namespace")
        path = f"{RBAC}/namespaces/{ns}/roles/{ref['name']}" if ref["kind"] == "Role" else \
            f"{RBAC}/clusterroles/{ref['name']}"
        rules = cp.api("GET", path).get("rules") or []
        if not rules:
            continue
        for s in b.get("subjects") or []:
            if s.get("kind") == "ServiceAccount":
                checks.append((f"system:serviceaccount:{s['namespace']}:{s['name']}", _first_attributes(rules[0], ns)))
    deadline = time.monotonic() + timeout
    while checks:
        checks = [(user, attrs) for user, attrs in checks if not can(cp, user, attrs)]
        if not checks:
            return
        if time.monotonic() > deadline:
            raise ControlPlaneError(f"RBAC not in effect after {timeout}s for: {checks}")
        time.sleep(0.05)


def request_token(cp: ControlPlane, namespace: str, service_account: str, seconds: int = TOKEN_SECONDS) -> str:
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"expirationSeconds": seconds}}
    out = cp.api("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token", body)
    return str(out["status"]["token"])


def write_kubeconfig(cp: ControlPlane, path: Path, user: str, token: str) -> None:
    kc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "mtsched-local", "cluster": {
            "server": cp.server_url, "certificate-authority-data": base64.b64encode(cp.ca_pem).decode()}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "mtsched-local", "context": {"cluster": "mtsched-local", "user": user}}],
        "current-context": "mtsched-local",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)  # a credential: private before it is written
    path.write_text(yaml.safe_dump(kc, sort_keys=False))


def provision(cp: ControlPlane, manifest: Path = MANIFEST, directory: Path | None = None) -> Identities:
    """Apply the manifest's identities and RBAC to `cp`; one kubeconfig per role in `directory`."""
    objs = load_manifest(manifest)
    accounts = role_service_accounts(objs)
    applied = apply_rbac(cp, objs)
    wait_effective(cp, (o for o in applied if o["kind"] in ("ClusterRoleBinding", "RoleBinding")))
    out_dir = directory or (cp.workdir / "identities")
    tokens: dict[tuple[str, str], str] = {}
    roles: dict[str, Identity] = {}
    for role, (ns, sa) in sorted(accounts.items()):
        if (ns, sa) not in tokens:
            tokens[(ns, sa)] = request_token(cp, ns, sa)
        ident = Identity(role, ns, sa, out_dir / f"{role}.kubeconfig")
        write_kubeconfig(cp, ident.kubeconfig, ident.username, tokens[(ns, sa)])
        roles[role] = ident
    return Identities(roles, tuple((o["kind"], _path(o)) for o in applied))


def deprovision(cp: ControlPlane, identities: Identities) -> None:
    """Delete what `provision` applied (its tokens die with their ServiceAccounts), so the plane is
    left as found: other tests apply the same chart objects (dry-runs, helm install). Namespaces
    stay: without kube-controller-manager they would never finish deleting."""
    for kind, path in reversed(identities.applied):
        if kind != "Namespace":
            cp.api("DELETE", path, ok=(200, 202, 404))
