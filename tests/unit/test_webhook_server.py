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
from webhook.server import CertReloader, handle_review

CFG = load_config(env={}, flags={"memoryPerCard": "160"})


def review(obj: object, op: str = "CREATE") -> bytes:
    return orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                         "request": {"uid": "r-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                                     "operation": op, "namespace": "ns", "object": obj}})


def pod(limits: dict[str, str]) -> dict[str, object]:
    return {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}


@pytest.mark.parametrize("body", [b"", b"not json", b"[]", b'{"request": {}}', b'{"request": {"uid": 5}}',
                                  review("a string"), review({"spec": "x"})])
def test_malformed_reviews_get_400(body: bytes) -> None:
    status, out = handle_review(body, CFG, ())
    assert status == 400 and "error" in out


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


def test_other_operations_are_allowed_untouched() -> None:
    status, out = handle_review(review(pod({"mthreads.com/vgpu": "1"}), op="UPDATE"), CFG, ())
    assert status == 200 and out["response"] == {"uid": "r-1", "allowed": True}


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
