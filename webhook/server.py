"""The admission webhook: AdmissionReview v1 over HTTPS, applying shared.admission.decide.

Malformed reviews get HTTP 400 and never reach the decision; the decision itself is pure, so a
bad pod can only ever produce a denial. The per-card capacities the cluster reports (for the
exclusive and multi-card default) come from this replica's ledger mirror.
"""

from __future__ import annotations

import base64
import logging
import os
import ssl
import time
from collections.abc import Callable, Collection
from typing import Any

import orjson
from aiohttp import web

from shared.admission import Decision, decide
from shared.config import Config
from shared.metrics import ADMISSIONS, WEBHOOK_SECONDS

log = logging.getLogger("mtsched.webhook")


def review_response(uid: str, d: Decision) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": d.allowed}
    if d.allowed and d.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(orjson.dumps(list(d.patch))).decode()
    if not d.allowed:
        response["status"] = {"code": d.code, "message": d.message,
                              "reason": "Forbidden" if d.code == 403 else "BadRequest"}
    if d.warnings:
        response["warnings"] = list(d.warnings)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def handle_review(body: bytes, cfg: Config, capacities: Collection[int]) -> tuple[int, dict[str, Any]]:
    """(HTTP status, response JSON) for a raw AdmissionReview body."""
    try:
        review = orjson.loads(body)
    except orjson.JSONDecodeError:
        return 400, {"error": "body is not JSON"}
    request = review.get("request") if isinstance(review, dict) else None
    if not isinstance(request, dict) or not isinstance(request.get("uid"), str):
        return 400, {"error": "not an AdmissionReview with request.uid"}
    uid = request["uid"]
    obj = request.get("object")
    kind = (request.get("kind") or {}).get("kind") if isinstance(request.get("kind"), dict) else None
    if kind not in (None, "Pod") or (request.get("operation") not in (None, "CREATE")):
        return 200, review_response(uid, Decision(True))  # only pod creation is ours to judge
    if not isinstance(obj, dict) or not isinstance(obj.get("spec"), dict):
        return 400, {"error": "request.object is not a Pod"}
    try:
        decision = decide(obj, cfg, capacities)
    except Exception as e:  # a pod must never crash the server: deny with the cause
        log.exception("admission decision failed")
        decision = Decision(False, message=f"cannot judge this pod: {type(e).__name__}: {e}", code=400)
    ADMISSIONS.labels("allowed" if decision.allowed else "denied").inc()
    meta = obj.get("metadata") or {}
    name = meta.get("name") or meta.get("generateName") or "?"
    if not decision.allowed:
        log.info("denied %s/%s: %s", request.get("namespace"), name, decision.message)
    return 200, review_response(uid, decision)


class CertReloader:
    """Serves the certificate from files and picks up renewed files without a restart."""

    def __init__(self, cert: str, key: str):
        self.cert, self.key = cert, key
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._stamp: tuple[float, float] = (0.0, 0.0)
        self.reloads = 0
        self.maybe_reload()

    def maybe_reload(self) -> bool:
        stamp = (os.stat(self.cert).st_mtime, os.stat(self.key).st_mtime)
        if stamp == self._stamp:
            return False
        self.context.load_cert_chain(self.cert, self.key)  # new handshakes use the new pair
        self._stamp = stamp
        self.reloads += 1
        log.info("loaded TLS certificate %s", self.cert)
        return True


class Webhook:
    def __init__(self, cfg: Config, capacities: Callable[[], Collection[int]]):
        self.cfg = cfg
        self.capacities = capacities

    async def h_review(self, request: web.Request) -> web.Response:
        start = time.perf_counter()
        status, out = handle_review(await request.read(), self.cfg, self.capacities())
        result = "bad" if status != 200 else ("allowed" if out["response"]["allowed"] else "denied")
        WEBHOOK_SECONDS.labels(result).observe(time.perf_counter() - start)
        return web.Response(body=orjson.dumps(out), status=status, content_type="application/json")

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/mutate", self.h_review)
        app.router.add_post("/webhook", self.h_review)  # HAMi's path, for drop-in configurations
