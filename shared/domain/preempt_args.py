"""kube-scheduler's ExtenderPreemptionArgs (extender/v1), checked strictly (pure).

`Pod` (the preemptor) and, per candidate node, the victims of kube-scheduler's dry run: a
node-cache-capable extender gets `NodeNameToMetaVictims` (`{"Pods": [{"UID": ...}],
"NumPDBViolations": n}`), any other `NodeNameToVictims` (`{"Pods": [<Pod>...], ...}`). The answer is
always `NodeNameToMetaVictims` (ExtenderPreemptionResult). Field names are matched as Go does
(case-insensitively, shared/domain/extender_args.py); bad shapes raise ArgsError (HTTP 400).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shared.domain.extender_args import INT32, ArgsError, _fields, _pod
from shared.domain.shapes import MAX_NODES, MAX_UID_CHARS, describe, is_dns_label, is_dns_subdomain, is_uid, problem

MAX_VICTIMS = 1024  # per node: far above the pods a node runs (kubelet default 110)
UID_ALLOWED = f"a uid of 1..{MAX_UID_CHARS} characters [A-Za-z0-9._-]"


@dataclass(frozen=True)
class VictimRef:
    uid: str
    priority: int | None = None  # known only from full pods (NodeNameToVictims)


@dataclass(frozen=True)
class NodeVictims:
    pods: tuple[VictimRef, ...]
    pdb_violations: int


@dataclass(frozen=True)
class PreemptionArgs:
    pod: Mapping[str, Any]
    nodes: Mapping[str, NodeVictims]
    meta: bool  # the victims came as UIDs (NodeNameToMetaVictims)

    @property
    def priority(self) -> int:
        """The preemptor's priority (spec.priority, set by the API server's Priority admission; 0 without)."""
        value = (self.pod.get("spec") or {}).get("priority")
        return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _priority(spec: object, field: str) -> int | None:
    value = spec.get("priority") if isinstance(spec, dict) else None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not -INT32 <= value < INT32:
        raise ArgsError(problem(field, value, "a 32-bit integer"))
    return value


def _victim(doc: object, field: str, meta: bool) -> VictimRef:
    if meta:
        if not isinstance(doc, dict):
            raise ArgsError(problem(field, doc, "a MetaPod object with UID"))
        f = _fields(doc, ("UID",), "MetaPod")
        if not is_uid(f.get("UID")):
            raise ArgsError(problem(f"{field}.UID", f.get("UID"), UID_ALLOWED))
        return VictimRef(f["UID"])
    m = doc.get("metadata") if isinstance(doc, dict) else None
    if not isinstance(m, dict):
        raise ArgsError(problem(field, doc, "a Pod object with metadata"))
    if not is_uid(m.get("uid")):
        raise ArgsError(problem(f"{field}.metadata.uid", m.get("uid"), UID_ALLOWED))
    if not is_dns_subdomain(m.get("name")):
        raise ArgsError(problem(f"{field}.metadata.name", m.get("name"), "a pod name (DNS-1123 subdomain)"))
    if not is_dns_label(m.get("namespace")):
        raise ArgsError(problem(f"{field}.metadata.namespace", m.get("namespace"),
                                "a namespace name (DNS-1123 label)"))
    assert isinstance(doc, dict)
    return VictimRef(m["uid"], _priority(doc.get("spec"), f"{field}.spec.priority"))


def _node_victims(doc: object, field: str, meta: bool) -> NodeVictims:
    if not isinstance(doc, dict):
        raise ArgsError(problem(field, doc, "an object with Pods and NumPDBViolations"))
    f = _fields(doc, ("Pods", "NumPDBViolations"), "MetaVictims" if meta else "Victims")
    pods, pdb = f.get("Pods"), f.get("NumPDBViolations", 0)
    if not isinstance(pods, list) or not 0 < len(pods) <= MAX_VICTIMS:
        raise ArgsError(problem(f"{field}.Pods", pods, f"a list of 1..{MAX_VICTIMS} victims"))
    if isinstance(pdb, bool) or not isinstance(pdb, int) or not 0 <= pdb <= len(pods):
        raise ArgsError(problem(f"{field}.NumPDBViolations", pdb, f"an integer 0..{len(pods)} (the victims)"))
    refs = tuple(_victim(p, f"{field}.Pods[{i}]", meta) for i, p in enumerate(pods))
    if len({r.uid for r in refs}) != len(refs):
        raise ArgsError(f"{field}.Pods: a victim is listed twice; allowed: each pod once")
    return NodeVictims(refs, pdb)


def parse_preemption_args(doc: object) -> PreemptionArgs:
    """Preempt arguments; ArgsError names the first malformed field."""
    f = _fields(doc, ("Pod", "NodeNameToVictims", "NodeNameToMetaVictims"), "ExtenderPreemptionArgs")
    pod = _pod(f.get("Pod"))  # its spec.priority checked there
    full, metas = f.get("NodeNameToVictims"), f.get("NodeNameToMetaVictims")
    if (full is None) == (metas is None):
        raise ArgsError(f"NodeNameToMetaVictims: got {describe(metas)} and NodeNameToVictims: got "
                        f"{describe(full)}; allowed: exactly one of them (the victims per node)")
    meta = metas is not None
    name = "NodeNameToMetaVictims" if meta else "NodeNameToVictims"
    raw = metas if meta else full
    if not isinstance(raw, dict):
        raise ArgsError(problem(name, raw, "an object of node name to victims"))
    if len(raw) > MAX_NODES:
        raise ArgsError(f"{name}: {len(raw)} nodes; allowed: at most {MAX_NODES}")
    nodes = {}
    for node, victims in raw.items():
        if not is_dns_subdomain(node):
            raise ArgsError(problem(f"{name} key", node, "a node name (DNS-1123 subdomain)"))
        nodes[node] = _node_victims(victims, f"{name}[{node}]", meta)
    return PreemptionArgs(pod, nodes, meta)
