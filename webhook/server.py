"""The admission webhook: AdmissionReview v1 over HTTPS, applying shared.domain.admission.decide.

Malformed reviews get HTTP 400 and never reach the decision (shared/domain/review.py); the decision
itself is pure, so a bad pod can only ever produce a denial. The per-card capacities the cluster
reports (for the exclusive and multi-card default) come from this replica's ledger mirror. A CREATE
the rules allow is then checked against the namespace's ResourceQuotas in the forms the API server
does not enforce for extended resources (webhook/quotas.py reads them, shared/domain/quota.py judges).
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from shared.config import Config
from shared.domain.admission import WARNING_CHARS, Decision, decide, judge_update
from shared.domain.review import API_VERSION, AdmissionRequest, parse_review
from shared.domain.shapes import ShapeError, describe
from shared.serving.http import BodyBudget, BodyError, read_body
from shared.serving.listen import LISTEN_POLICY, webhook_policy
from shared.serving.metrics import ADMISSIONS, WEBHOOK_SECONDS
from shared.serving.tls import CertReloader
from webhook.quotas import QuotaReader

# CertReloader moved to shared/serving/tls.py (every role serves TLS); still importable from here.
__all__ = ["BODY_LIMIT", "MAX_MESSAGE_CHARS", "MAX_WARNINGS", "CertReloader", "Judged", "Webhook", "handle_review",
           "handle_review_with_quotas", "judge", "respond", "review_response"]

log = logging.getLogger("mtsched.webhook")

# client_max_size of the webhook's application (a larger body gets 413): the API server's own limit on the body of a
# pod CREATE (3 MiB); the budget below refuses sooner a body whose decoding would take more than a caller's share
BODY_LIMIT = 3 * 1024 * 1024
# What the reviews being handled may hold at once, read and decoded (shared/serving/http.py json_cost), in all and
# from one peer address (half): the chart gives the webhook 256 MiB, ~85 of them its own, and the bound is the peak of
# a decoding (one at a time), most of which is gone once decoded. A review of 1.5 MiB (the most the API server stores of
# a pod, in protobuf: its JSON may be larger) fits a peer's share unless its JSON values average under 7 bytes
# (docs/install.md "Input limits"); 8 MB of `[],` took 250 MiB before (red team, 2026-12-07).
BODY_BUDGET_BYTES = 128 * 1024 * 1024
REASONS = {403: "Forbidden", 503: "ServiceUnavailable"}  # metav1.StatusReason of a denial's code
MAX_MESSAGE_CHARS = 4096  # a denial lists every problem; the cap keeps the API server's error and event small
MAX_WARNINGS = 10  # warnings an allowed pod gets, each cut to WARNING_CHARS: within the API server's 4096 characters


def review_response(uid: str, d: Decision) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": d.allowed}
    if d.allowed and d.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(orjson.dumps(list(d.patch))).decode()
    if not d.allowed:
        message = d.message
        if len(message) > MAX_MESSAGE_CHARS:
            message = f"{message[:MAX_MESSAGE_CHARS]}... ({len(message) - MAX_MESSAGE_CHARS} more characters)"
        response["status"] = {"code": d.code, "message": message,
                              "reason": REASONS.get(d.code, "BadRequest")}
    if d.warnings:
        # the first few, each as long as the API server keeps one, then how many more: one per exclusive container
        # was 1,024 warnings of up to 300 characters, of which the API server keeps 4096 characters in all (red team)
        response["warnings"] = [w[:WARNING_CHARS] for w in d.warnings[:MAX_WARNINGS]] + (
            [f"and {len(d.warnings) - MAX_WARNINGS} more warnings"] if len(d.warnings) > MAX_WARNINGS else [])
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}


@dataclass(frozen=True)
class Judged:
    req: AdmissionRequest
    decision: Decision


def judge(body: bytes, cfg: Config, capacities: Collection[int],
          mismatched: Mapping[str, str] | None = None) -> Judged | tuple[int, dict[str, Any]]:
    """The pure decision for a raw AdmissionReview body, or (400, {"error": ...}) for a bad body."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        return 400, {"error": f"body: not JSON ({e}); allowed: an AdmissionReview object"}
    try:
        req = parse_review(doc)
    except ShapeError as e:
        return 400, {"error": str(e)}
    try:
        if req.operation == "CREATE":
            decision = decide(req.obj, cfg, capacities, mismatched)
        else:
            assert req.old is not None  # parse_review guarantees it for UPDATE
            decision = judge_update(req.old, req.obj, req.user, cfg)
    except Exception as e:  # a bug must not become a 500 (the API server would fail the request unexplained)
        log.exception("admission decision failed")
        decision = Decision(False, message=f"cannot judge this pod: {type(e).__name__}: {e}", code=400)
    return Judged(req, decision)


def respond(j: Judged) -> tuple[int, dict[str, Any]]:
    req, decision = j.req, j.decision
    ADMISSIONS.labels("allowed" if decision.allowed else "denied").inc()
    if not decision.allowed:
        meta = req.obj.get("metadata")
        meta = meta if isinstance(meta, dict) else {}
        name = meta.get("name") or meta.get("generateName") or "?"
        log.info("denied %s %s/%s: %s", req.operation, req.namespace, describe(name),
                 decision.message[:MAX_MESSAGE_CHARS])
    return 200, review_response(req.uid, decision)


def handle_review(body: bytes, cfg: Config, capacities: Collection[int],
                  mismatched: Mapping[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    """(HTTP status, response JSON) for a raw AdmissionReview body, without the quota check.

    400 with {"error": "<field>: got <value>; allowed: ..."} when the body is not a v1 AdmissionReview
    of a Pod CREATE or UPDATE; otherwise 200 with the decision (a malformed pod is a denial naming
    the field, which the API server shows to the user).
    """
    j = judge(body, cfg, capacities, mismatched)
    return j if isinstance(j, tuple) else respond(j)


async def handle_review_with_quotas(body: bytes, cfg: Config, capacities: Collection[int],
                                    quotas: QuotaReader,
                                    mismatched: Mapping[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    """handle_review, then a CREATE the rules allow is checked against the namespace's quotas in the
    forms the API server does not enforce for extended resources (shared/domain/quota.py)."""
    j = judge(body, cfg, capacities, mismatched)
    if isinstance(j, tuple):
        return j
    if j.req.operation == "CREATE":
        j = Judged(j.req, await quotas.judge(j.req.namespace, j.req.obj, j.decision))
    return respond(j)


class Webhook:
    def __init__(self, cfg: Config, capacities: Callable[[], Collection[int]], quotas: QuotaReader | None = None,
                 mismatched: Callable[[], Mapping[str, str]] = dict):
        self.cfg = cfg
        self.capacities = capacities
        self.quotas = quotas  # None: no quota check (unit tests of the admission rules alone)
        self.mismatched = mismatched  # nodes with sliced cards that offer none, and why (the mirror's)

    async def h_review(self, request: web.Request) -> web.Response:
        start = time.perf_counter()
        try:
            body = await read_body(request)
        except BodyError as e:
            WEBHOOK_SECONDS.labels("bad").observe(time.perf_counter() - start)
            return web.Response(body=orjson.dumps({"error": e.message}), status=e.status,
                                content_type="application/json", headers=e.headers)
        if self.quotas is None:
            status, out = handle_review(body, self.cfg, self.capacities(), self.mismatched())
        else:
            status, out = await handle_review_with_quotas(body, self.cfg, self.capacities(), self.quotas,
                                                         self.mismatched())
        result = "bad" if status != 200 else ("allowed" if out["response"]["allowed"] else "denied")
        WEBHOOK_SECONDS.labels(result).observe(time.perf_counter() - start)
        return web.Response(body=orjson.dumps(out), status=status, content_type="application/json")

    def routes(self, app: web.Application) -> None:
        app[LISTEN_POLICY] = webhook_policy(self.cfg)
        BodyBudget(BODY_BUDGET_BYTES, BODY_BUDGET_BYTES // 2).install(app)
        app.router.add_post("/mutate", self.h_review)
        app.router.add_post("/webhook", self.h_review)  # HAMi's path, for drop-in configurations
