"""The AdmissionReview envelope, checked strictly before anything is judged (pure).

What is not an admission.k8s.io/v1 AdmissionReview of a v1 Pod CREATE or UPDATE is answered with
HTTP 400 by the webhook: the API server then fails the request (our failurePolicy is Fail), so a
misregistered webhook or a garbage caller is visible instead of being allowed unjudged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shared.domain.shapes import MAX_NAME_CHARS, MAX_UID_CHARS, ShapeError, is_dns_label

API_VERSION = "admission.k8s.io/v1"
OPERATIONS = ("CREATE", "UPDATE")  # the webhook is registered for CREATE; UPDATE is judged too
POD_KIND = {"group": "", "version": "v1", "kind": "Pod"}
POD_RESOURCE = {"group": "", "version": "v1", "resource": "pods"}


@dataclass(frozen=True)
class AdmissionRequest:
    uid: str
    operation: str
    obj: Mapping[str, Any]
    old: Mapping[str, Any] | None  # UPDATE only
    namespace: str
    user: str
    sub_resource: str


def _gvk(request: Mapping[str, Any], key: str, want: Mapping[str, str], required: bool) -> None:
    value = request.get(key)
    if value is None and not required:
        return
    allowed = "{" + ", ".join(f'{k}: "{v}"' for k, v in want.items()) + "}"
    if not isinstance(value, dict):
        raise ShapeError(f"request.{key}", value, allowed)
    for k, v in want.items():
        if value.get(k) != v:
            raise ShapeError(f"request.{key}.{k}", value.get(k), f'"{v}" (only {allowed} is reviewed here)')


def _pod_object(request: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    obj = request.get(key)
    if not isinstance(obj, dict) or not isinstance(obj.get("spec"), dict):
        raise ShapeError(f"request.{key}", obj, "a Pod object with a spec")
    return obj


def _optional_str(obj: Mapping[str, Any], key: str, field: str, limit: int = MAX_NAME_CHARS) -> str:
    value = obj.get(key)
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > limit:
        raise ShapeError(field, value, f"a string of at most {limit} characters")
    return value


def parse_review(doc: object) -> AdmissionRequest:
    """The request of a v1 AdmissionReview of a Pod CREATE or UPDATE; ShapeError otherwise."""
    if not isinstance(doc, dict):
        raise ShapeError("body", doc, "an AdmissionReview object")
    if doc.get("apiVersion") != API_VERSION:
        raise ShapeError("apiVersion", doc.get("apiVersion"), f'"{API_VERSION}"')
    if doc.get("kind") != "AdmissionReview":
        raise ShapeError("kind", doc.get("kind"), '"AdmissionReview"')
    request = doc.get("request")
    if not isinstance(request, dict):
        raise ShapeError("request", request, "an AdmissionRequest object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not 0 < len(uid) <= MAX_UID_CHARS:
        raise ShapeError("request.uid", uid, f"a non-empty string of at most {MAX_UID_CHARS} characters")
    _gvk(request, "kind", POD_KIND, required=True)
    _gvk(request, "resource", POD_RESOURCE, required=False)
    op = request.get("operation")
    if op not in OPERATIONS:
        raise ShapeError("request.operation", op, ", ".join(OPERATIONS))
    obj = _pod_object(request, "object")
    old = _pod_object(request, "oldObject") if op == "UPDATE" else None
    if op == "CREATE" and request.get("oldObject") is not None:
        raise ShapeError("request.oldObject", request.get("oldObject"), "null for CREATE")
    user_info = request.get("userInfo")
    if user_info is not None and not isinstance(user_info, dict):
        raise ShapeError("request.userInfo", user_info, "an object")
    # system:serviceaccount:<namespace>:<name> is longer than a name
    user = _optional_str(user_info or {}, "username", "request.userInfo.username", limit=1024)
    if request.get("dryRun") is not None and not isinstance(request.get("dryRun"), bool):
        raise ShapeError("request.dryRun", request.get("dryRun"), "true or false")
    namespace = _optional_str(request, "namespace", "request.namespace")
    # the API server reviews pods only in namespaces that exist, whose names are DNS-1123 labels; the name
    # goes into the quota reads' paths and cache keys
    if namespace and not is_dns_label(namespace):
        raise ShapeError("request.namespace", namespace, "a namespace name (DNS-1123 label)")
    return AdmissionRequest(
        uid=uid, operation=str(op), obj=obj, old=old, namespace=namespace, user=user,
        sub_resource=_optional_str(request, "subResource", "request.subResource"),
    )
