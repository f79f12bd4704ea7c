"""Which allocation records the ledger may book: only those our bind can have written.

Our extender binds only pods that ask for our resources and are scheduled by our profile
(shared/domain/placement.py bind_refusal), and writes the record with the Binding. A record on any other
pod (a CPU pod, a pod another scheduler bound) was written by someone else: booking it would take
cards from the pods we place, so the watchers and rebuilds ignore it (and say so). The API server's
admission policy (deploy/helm/hami/templates/webhook/admissionpolicy.yaml) refuses such records in
the first place; this is the ledger's own line of defence for clusters without it.
"""

from __future__ import annotations

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
    pod asks for slices (controller/watchers.py unaccounted): it holds cards whoever placed it (HAMi's pods after
    a migration under another schedulerName), so, like a pod whose record is gone, it is booked from what survives
    on it or its node is closed (shared/domain/reconcile.py recovered_usage); "nothing is booked" was false."""
    if not asks_cards:
        return "nothing is booked for it"
    return ("its record is not booked as written: the cards its mthreads.com/gpu-index names are booked with the "
            "amounts its request implies, or, when those do not tell, its node offers no card until it ends")
