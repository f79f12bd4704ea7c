"""The webhook's shell: AdmissionReview decoding/encoding, malformed input, certificate reload."""

from __future__ import annotations

import base64
import os
import ssl
import time
from pathlib import Path

import orjson
import pytest

from deploy.local.pki import make_ca, make_serving_cert
from shared.config import load_config
from shared.domain.shapes import MAX_CONTAINERS
from webhook.server import MAX_MESSAGE_CHARS, CertReloader, handle_review

CFG = load_config(env={}, flags={"memoryPerCard": "160"})


def review(obj: object, op: str = "CREATE") -> bytes:
    return orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                         "request": {"uid": "r-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                                     "operation": op, "namespace": "ns", "object": obj}})


def pod(limits: dict[str, str]) -> dict[str, object]:
    return {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}


def envelope(**changes: object) -> bytes:
    doc = orjson.loads(review(pod({})))
    for path, value in changes.items():
        target = doc
        *parents, last = path.split("__")
        for p in parents:
            target = target[p]
        if value is DROP:
            del target[last]
        else:
            target[last] = value
    return orjson.dumps(doc)


DROP = object()


@pytest.mark.parametrize(("body", "field"), [
    (b"", "body"), (b"not json", "body"), (b"[]", "body"), (b"[" * 2000 + b"]" * 2000, "body"),
    (b'{"request": {}}', "apiVersion"),
    (envelope(kind="AdmissionReviewList"), "kind"),
    (envelope(apiVersion=DROP), "apiVersion"),
    (envelope(request=[]), "request"),
    (envelope(request__uid=5), "request.uid"),
    (envelope(request__uid=""), "request.uid"),
    (envelope(request__uid="u" * 129), "request.uid"),
    (envelope(request__kind=DROP), "request.kind"),
    (envelope(request__kind__version="v2"), "request.kind.version"),
    (envelope(request__kind__group="apps"), "request.kind.group"),
    (envelope(request__resource={"group": "", "version": "v1", "resource": "pods/binding"}),
     "request.resource.resource"),
    (envelope(request__operation=DROP), "request.operation"),
    (envelope(request__operation="CONNECT"), "request.operation"),
    (envelope(request__operation=["CREATE"]), "request.operation"),
    (envelope(request__object="a string"), "request.object"),
    (envelope(request__object={"spec": "x"}), "request.object"),
    (envelope(request__object=DROP), "request.object"),
    (envelope(request__oldObject={"spec": {}}), "request.oldObject"),
    (envelope(request__namespace=5), "request.namespace"),
    (envelope(request__namespace="../kube-system"), "request.namespace"),  # no namespace is named so
    (envelope(request__namespace="NS"), "request.namespace"),
    (envelope(request__namespace="n" * 64), "request.namespace"),
    (envelope(request__userInfo="admin"), "request.userInfo"),
    (envelope(request__userInfo={"username": 5}), "request.userInfo.username"),
    (envelope(request__dryRun="yes"), "request.dryRun"),
])
def test_malformed_reviews_get_400_naming_the_field(body: bytes, field: str) -> None:
    status, out = handle_review(body, CFG, ())
    assert status == 400 and set(out) == {"error"}
    assert out["error"].startswith(f"{field}: ") and "allowed: " in out["error"], out["error"]


def test_the_value_in_a_400_is_truncated() -> None:
    status, out = handle_review(envelope(request__operation="X" * 10_000), CFG, ())
    assert status == 400 and "(10000 characters)" in out["error"] and len(out["error"]) < 300


def test_exclusive_s5000_patch_round_trips() -> None:
    status, out = handle_review(review(pod({"mthreads.com/vgpu": "1"})), CFG, {160})
    assert status == 200
    resp = out["response"]
    assert resp["uid"] == "r-1" and resp["allowed"] is True and resp["patchType"] == "JSONPatch"
    patch = orjson.loads(base64.b64decode(resp["patch"]))
    assert {"op": "add", "path": "/spec/containers/0/resources/limits/mthreads.com~1sgpu-memory",
            "value": "160"} in patch
    assert any("80 GiB" in w for w in resp["warnings"])


def test_denial_carries_code_and_message() -> None:
    status, out = handle_review(review(pod({"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "96"})), CFG, ())
    resp = out["response"]
    assert status == 200 and resp["allowed"] is False and resp["status"]["code"] == 403
    assert "mthreads.com/sgpu-memory=96" in resp["status"]["message"]
    assert "allowed: 2, 4, 8, 16, 32, 64, 128, 160" in resp["status"]["message"]
    assert "patch" not in resp


def update(old: object, new: object) -> bytes:
    doc = orjson.loads(review(new, op="UPDATE"))
    doc["request"]["oldObject"] = old
    return orjson.dumps(doc)


def test_update_keeping_the_card_resources_is_allowed_without_patch() -> None:
    p = pod({"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "160", "mthreads.com/sgpu-core": "16"})
    labelled = {**p, "metadata": {"name": "p", "labels": {"team": "a"}}}
    status, out = handle_review(update(p, labelled), CFG, ())
    assert status == 200 and out["response"] == {"uid": "r-1", "allowed": True}


@pytest.mark.parametrize("new_limits", [{"mthreads.com/vgpu": "2"}, {},
                                        {"mthreads.com/vgpu": "1", "mthreads.com/gpu": "1"}])
def test_update_changing_the_card_resources_is_denied(new_limits: dict[str, str]) -> None:
    status, out = handle_review(update(pod({"mthreads.com/vgpu": "1"}), pod(new_limits)), CFG, ())
    resp = out["response"]
    assert status == 200 and resp["allowed"] is False
    assert resp["status"]["message"].startswith('container "c": mthreads.com/vgpu, ')


def test_update_with_a_malformed_pod_is_denied_naming_it() -> None:
    status, out = handle_review(update(pod({}), {"spec": {"containers": [5]}}), CFG, ())
    assert status == 200 and out["response"]["allowed"] is False
    assert out["response"]["status"]["message"].startswith("object: spec.containers[0]: got 5")


def test_a_denial_longer_than_the_cap_is_cut_and_says_so() -> None:
    limits = {"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "3"}
    containers = [{"name": f"c{i}", "resources": {"limits": limits}} for i in range(300)]
    status, out = handle_review(review({"metadata": {"name": "p"}, "spec": {"containers": containers}}), CFG, ())
    message = out["response"]["status"]["message"]
    assert status == 200 and out["response"]["allowed"] is False
    assert len(message) < MAX_MESSAGE_CHARS + 100 and message.endswith("more characters)")


def test_container_cap_is_a_denial_before_any_rule() -> None:
    containers = [{"name": f"c{i}"} for i in range(MAX_CONTAINERS + 1)]
    status, out = handle_review(review({"metadata": {"name": "p"}, "spec": {"containers": containers}}), CFG, ())
    assert status == 200 and out["response"]["allowed"] is False
    assert out["response"]["status"]["message"] == (
        f"spec: {MAX_CONTAINERS + 1} containers and initContainers; allowed: at most {MAX_CONTAINERS} in all")
    fine = [{"name": f"c{i}"} for i in range(MAX_CONTAINERS)]
    assert handle_review(review({"metadata": {"name": "p"}, "spec": {"containers": fine}}), CFG, ())[1][
        "response"]["allowed"] is True


def test_certificate_files_are_reloaded_when_they_change(tmp_path: Path) -> None:
    ca = make_ca()
    first, second = make_serving_cert(ca, "one"), make_serving_cert(ca, "two")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(first.cert_pem)
    key.write_bytes(first.key_pem)
    reloader = CertReloader(str(cert), str(key))
    assert reloader.reloads == 1 and not reloader.maybe_reload()
    cert.write_bytes(second.cert_pem)
    key.write_bytes(second.key_pem)
    later = time.time() + 5
    os.utime(cert, (later, later))
    os.utime(key, (later, later))
    assert reloader.maybe_reload() and reloader.reloads == 2
    assert isinstance(reloader.context, ssl.SSLContext)
    key.write_bytes(b"garbage")
    os.utime(key, (later + 5, later + 5))
    with pytest.raises(ssl.SSLError):
        reloader.maybe_reload()  # the caller logs it and keeps serving the previous pair
