"""Which allocation records the ledger may book: only those our bind can have written.

Our extender binds only pods that ask for our resources and are scheduled by our profile
(shared/domain/placement.py bind_refusal), and writes the record with the Binding. A record on any other
pod (a CPU pod, a pod another scheduler bound) was written by someone else: booking it would take
cards from the pods we place, so the watchers and rebuilds ignore it (and say so). The API server's
admission policy (deploy/helm/hami/templates/webhook/admissionpolicy.yaml) refuses such records in
the first place; this is the ledger's own line of defence for clusters without it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from shared.config import Config


def _asks(container: object, names: tuple[str, ...]) -> bool:
    res = container.get("resources") if isinstance(container, dict) else None
    if not isinstance(res, dict):
        return False
    return any(isinstance(part, dict) and any(n in part for n in names)
               for part in (res.get("limits"), res.get("requests")))


def asks_slices(pod: Mapping[str, Any], cfg: Config) -> bool:
    """Whether any container or init container names one of our slice resources in its limits or requests: the
    admission policy's own test. A pod that names none holds no card, whatever else about it cannot be read
    (ephemeral containers and pod-level resources cannot name them: the API server refuses)."""
    spec = pod.get("spec")
    spec = spec if isinstance(spec, dict) else {}
    names = tuple(cfg.slice_resources)
    for key in ("initContainers", "containers"):
        part = spec.get(key)
        if isinstance(part, list) and any(_asks(c, names) for c in part):
            return True
    return False


def foreign_record(pod: Mapping[str, Any], cfg: Config) -> str:
    """Why a record on `pod` cannot be our bind's ("" when it can): the same test as the admission policy's
    (any container or init container asking for one of our resources) plus our scheduler's name."""
    spec = pod.get("spec")
    spec = spec if isinstance(spec, dict) else {}
    scheduler = spec.get("schedulerName") or "default-scheduler"
    if scheduler != cfg.scheduler_name:
        return f'its schedulerName is "{scheduler}", not "{cfg.scheduler_name}"'
    if not asks_slices(pod, cfg):
        return f"it asks for none of {', '.join(cfg.slice_resources)}"
    return ""



def foreign_fate(asks_cards: bool) -> str:
    """What the watchers do for a bound pod whose record is foreign (foreign_record says why). `asks_cards`: the
    pod asks for slices (controller/pod_watch.py unaccounted): it holds cards whoever placed it (HAMi's pods after
    a migration under another schedulerName), so, like a pod whose record is gone, it is booked from what survives
    on it or its node is closed (shared/domain/reconcile.py recovered_usage); "nothing is booked" was false."""
    if not asks_cards:
        return "nothing is booked for it"
    return ("its record is not booked as written: the cards its mthreads.com/gpu-index names are booked with the "
            "amounts its request implies, or, when those do not tell, its node offers no card until it ends")


# How long one refusal of our own Binding by the chart's admission policy keeps the extender unready without
# another bind: kube-scheduler retries a refused pod within its backoff (up to 10 s), so while the identity is
# wrong a pending pod renews it; with no pod left to bind it ends
REFUSED_BY_POLICY_SECONDS = 300.0


def refused_by_own_policy(status: int, message: str, scheduler_name: str) -> bool:
    """Whether the API server refused a Binding our extender sent because the chart's admission policy does not
    take this process for the scheduler's identity (admissionpolicy.yaml's `bindingRecord` validation, whose
    message this matches; reason Forbidden, 403): every Binding it sends will be refused, so it cannot do its job.
    The policy judges only who sends a Binding with a record, never what a pod carries, so no pod creator can make
    this true; other refusals (a third party's admission, a pod gone) stay per pod."""
    return status == 403 and re.search(
        r"ValidatingAdmissionPolicy '[^']*' with binding '[^']*' denied request: a Binding carrying [\w./, -]+ may "
        rf"only be made by {re.escape(scheduler_name)} \(it books the cards", message) is not None


def refusal_problem(refused: tuple[float, str] | None, now: float) -> str:
    """The extender's readiness problem after its Bindings were refused by the policy: `refused` is (when, the API
    server's message) of the last such refusal since the last Binding that went through; "" when none, or when
    older than REFUSED_BY_POLICY_SECONDS."""
    if refused is None or now - refused[0] > REFUSED_BY_POLICY_SECONDS:
        return ""
    said = refused[1]
    said = said[said.find("denied request: ") + len("denied request: "):] if "denied request: " in said else said
    return (f"the admission policy refuses this extender's Bindings ({said[:1024]}): is the extender running as "
            "the scheduler's ServiceAccount that the chart's ValidatingAdmissionPolicy names?")
