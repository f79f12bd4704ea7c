"""`mtsched explain NAMESPACE/POD` and the extender's GET /debug/explain?pod=NAMESPACE/POD: why a pod is Pending.

The shell around shared/domain/explain.py: it reads the pod (and, when the pod has a nodeSelector or
required node affinity, the nodes' labels) from the API server, and the cards from the ledger (the CLI,
like `mtsched cards`) or the extender's mirror (the endpoint), then renders the answer as text or JSON.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict

import orjson
from aiohttp import web

from shared.config import Config
from shared.domain.admission import placement_request
from shared.domain.explain import CardWhy, Explanation, NodeWhy, explain
from shared.domain.placement import NodeRequirement, node_requirement
from shared.domain.request import RequestError, SliceRequest, held_request
from shared.domain.shapes import ShapeError, describe, is_dns_label, is_dns_subdomain, printable
from shared.domain.state import NodeSnapshot
from shared.kube import Kube, KubeError
from shared.store.mirror import Mirror

log = logging.getLogger("mtsched.explain")

Snapshots = Callable[[], Awaitable[Mapping[str, NodeSnapshot]]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ExplainError(Exception):
    """The question cannot be answered; `status` is the HTTP status the endpoint answers with."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def parse_ref(ref: object) -> tuple[str, str]:
    """NAMESPACE/POD, or ExplainError(400) naming the value and what is allowed."""
    parts = ref.split("/") if isinstance(ref, str) else []
    if len(parts) != 2 or not is_dns_label(parts[0]) or not is_dns_subdomain(parts[1]):
        raise ExplainError(400, f"pod: got {describe(ref)}; allowed: NAMESPACE/NAME (a DNS label, a slash, a "
                                "DNS subdomain), e.g. default/my-pod")
    return parts[0], parts[1]


async def _labels(kube: Kube) -> dict[str, dict[str, str]] | None:
    try:
        listed = await kube.request("GET", "/api/v1/nodes")
    except KubeError:
        return None  # e.g. no `list nodes`: every node of the ledger counts as a candidate
    out: dict[str, dict[str, str]] = {}
    for n in listed.get("items") or [] if isinstance(listed, dict) else []:
        meta = n.get("metadata") or {}
        labels = meta.get("labels") or {}
        out[str(meta.get("name"))] = {k: v for k, v in labels.items() if isinstance(v, str)}
    return out


async def gather(kube: Kube, ref: str, snapshots: Snapshots, cfg: Config, unkept: str = "") -> Explanation:
    """`unkept`: why the extenders place no slice pod now (shared/domain/upkeep.py), "" when they may."""
    ns, name = parse_ref(ref)
    try:
        pod = await kube.get_pod(ns, name)
    except KubeError as e:
        raise ExplainError(404 if e.status == 404 else 502, f"cannot read pod {ns}/{name}: {e}") from None
    meta = pod.get("metadata") or {}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if isinstance(v, str)}
    bound = str((pod.get("spec") or {}).get("nodeName") or "")
    problems: list[str] = []
    req: SliceRequest | None = None
    requirement: NodeRequirement | None = None
    try:
        # a bound pod is judged as the watchers book it (not its pin: held_request); a pending one as the extender
        # would place it
        req = (held_request if bound else placement_request)(pod, cfg)
        requirement = node_requirement(pod)
    except RequestError as e:
        problems.extend(e.problems)
    except ShapeError as e:
        problems.append(str(e))
    labels = await _labels(kube) if requirement is not None and not requirement.unconstrained else None
    snaps = await snapshots()
    return explain(f"{ns}/{name}", req, annotations, snaps, cfg.gpu_scheduler_policy, problems=problems,
                   bound=bound, requirement=requirement, labels=labels, unkept=unkept)


def to_json(e: Explanation) -> bytes:
    return orjson.dumps(asdict(e), option=orjson.OPT_INDENT_2)


def _card_lines(c: CardWhy) -> list[str]:
    head = (f"  card {c.index} ({c.model}, {c.memory_used}/{c.capacity} units, {c.cores_used}/{c.cores} cores, "
            f"{c.slices}/{c.slice_limit} slices, {c.health})")
    if not c.reason:
        return [f"{head}: fits"]
    return [f"{head}: {c.reason}: {c.detail}"] + ([f"      to fit: {c.fix}"] if c.fix else [])


def _node_lines(n: NodeWhy) -> list[str]:
    if n.excluded:
        return [f"node {n.node}: not a candidate: {n.excluded}"]
    if n.mismatch:
        error = n.reason.removeprefix("node unregistered: ")
        return [f"node {n.node}: offers no card ({n.mismatch} mismatch): {error}"]
    if n.fits:
        lines = [f"node {n.node}: fits on card(s) {','.join(map(str, n.fits))}"]
    else:
        lines = [f"node {n.node}: {n.reason}" + (f" ({n.detail})" if n.detail else "")]
    return lines + [line for c in n.cards for line in _card_lines(c)]


def to_text(e: Explanation) -> str:
    lines = [f"pod {e.pod}", f"request: {e.request}", f"verdict: {e.summary}"]
    for n in e.nodes:
        lines.extend(_node_lines(n))
    # each line escaped as printed: a node's error comes from the ledger, which a release before the watchers
    # quoted what nodes wrote filled with it raw (a line break forged a line, an escape drove the terminal: red team)
    return "\n".join(map(printable, lines))


def render(e: Explanation, output: str) -> str:
    return to_json(e).decode() if output == "json" else to_text(e)


def explain_handler(cfg: Config, kube: Kube | None, mirror: Mirror,
                    unkept: Callable[[], str] = lambda: "") -> Handler:
    """GET /debug/explain?pod=NAMESPACE/NAME[&output=text]: the extender's answer from its mirror (JSON by
    default), and its own verdict on the watchers' stamp (`unkept`). Served on the extender's API port, so it
    needs what every other route needs (mutual TLS)."""
    async def snapshots() -> Mapping[str, NodeSnapshot]:
        return dict(mirror.nodes)

    async def handle(request: web.Request) -> web.Response:
        output = request.query.get("output", "json")
        try:
            if output not in ("json", "text"):
                raise ExplainError(400, f"output: got {describe(output)}; allowed: json, text")
            if kube is None:
                raise ExplainError(503, "explain: no API client")
            if not mirror.ready.is_set():
                raise ExplainError(503, "explain: card state not loaded yet (Redis unreachable?)")
            e = await gather(kube, request.query.get("pod", ""), snapshots, cfg, unkept())
        except ExplainError as err:
            return web.Response(body=orjson.dumps({"error": str(err)}), status=err.status,
                                content_type="application/json")
        except Exception as err:  # the API server unreachable, a bug: an answer that says so, never a 500
            log.exception("explain failed")
            return web.Response(body=orjson.dumps({"error": f"explain: {type(err).__name__}: {err}"}), status=502,
                                content_type="application/json")
        if output == "text":
            return web.Response(text=to_text(e) + "\n")
        return web.Response(body=to_json(e), content_type="application/json")

    return handle
