"""The scheduler extender: filter, prioritize and bind for kube-scheduler (extender/v1 wire format).

Filter and prioritize read only the local mirror (no Redis call per node). Bind books the card(s)
atomically in the ledger (one round trip when the mirror is current), creates the Binding with
the allocation annotations in the same API call, then marks the reservation bound (a second
round trip). On any failure the reservation is released and the error returned.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from typing import Any

import orjson
from aiohttp import web

from controller.kube import Kube, KubeError
from shared.annotations import ALLOCATED, CardGrant, binding_annotations, device_id
from shared.config import Config
from shared.fit import (
    GPU_POLICY,
    NODE_POLICY,
    NOUSE_UUID,
    USE_UUID,
    FitResult,
    aggregate_failures,
    extender_priority,
    fit,
    policy_of,
)
from shared.ledger import Ledger
from shared.metrics import BINDINGS, CONFLICTS, EXTENDER_SECONDS, RESERVATIONS
from shared.mirror import Mirror
from shared.models import UNIT_MIB
from shared.request import RequestError, SliceRequest, pod_request
from shared.state import CardRecord, NodeSnapshot

log = logging.getLogger("mtsched.extender")


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


class Extender:
    def __init__(self, cfg: Config, ledger: Ledger, mirror: Mirror, kube: Kube | None):
        self.cfg = cfg
        self.ledger = ledger
        self.mirror = mirror
        self.kube = kube
        self.pods: OrderedDict[str, dict[str, Any]] = OrderedDict()  # uid -> pod seen in filter (for bind)
        self._events: set[asyncio.Task[None]] = set()
        self._recent: dict[tuple[str, str, str], float] = {}  # (pod uid, reason, message) -> last sent
        # Memo of fit() and node scores per node, valid while the node's card states are the same object
        # (NodeSnapshot.states() keeps it while the cards are unchanged): between two pods only the nodes
        # booked meanwhile change, so a filter over hundreds of nodes computes only those again.
        self._fits: dict[str, tuple[NodeSnapshot, dict[int, CardRecord], dict[int, Any]]] = {}
        # ... and across nodes: nodes whose cards hold the same (often: nothing yet) get the same answer,
        # so a request shape seen for the first time costs one fit() per distinct card state, not per node.
        self._contents: dict[tuple[tuple[Any, ...], ...], int] = {}  # card states without the node -> id
        self._shared: dict[tuple[int, int], Any] = {}  # (content id, key id) -> FitResult or score
        self._keys: dict[tuple[Any, ...], int] = {}  # what a fit depends on -> small int (hashed once per call)

    # -- helpers -------------------------------------------------------------------------------

    def _remember(self, pod: dict[str, Any]) -> None:
        uid = str((pod.get("metadata") or {}).get("uid"))
        self.pods[uid] = pod
        self.pods.move_to_end(uid)
        while len(self.pods) > 10000:
            self.pods.popitem(last=False)

    def event(self, pod: dict[str, Any], reason: str, message: str, kind: str = "Normal") -> None:
        """Fire-and-forget Kubernetes event, so API latency never adds to a scheduling call."""
        if not (self.kube and self.cfg.events_enabled):
            return
        # kube-scheduler retries a Pending pod often: one event per pod, reason and message a minute
        key = (str((pod.get("metadata") or {}).get("uid")), reason, message)
        now = time.monotonic()
        if now - self._recent.get(key, -1e9) < 60:
            return
        self._recent[key] = now
        if len(self._recent) > 20000:
            self._recent = {k: t for k, t in self._recent.items() if now - t < 60}

        async def send() -> None:
            try:
                await self.kube.create_event(pod, reason, message, kind, self.cfg.scheduler_name)  # type: ignore[union-attr]
            except Exception as e:
                log.debug("event %s not recorded: %s", reason, e)

        task = asyncio.create_task(send())
        self._events.add(task)
        task.add_done_callback(self._events.discard)

    @staticmethod
    def _annotations(pod: dict[str, Any]) -> dict[str, str]:
        return dict((pod.get("metadata") or {}).get("annotations") or {})

    def _grants(self, node: str, req: SliceRequest, cards: tuple[int, ...], capacity: int) -> list[list[CardGrant]]:
        return [[CardGrant(device_id(node, i), s.memory * UNIT_MIB, s.cores) for i in cards] if not s.empty else []
                for s in req.shares_for(capacity)]

    def _key(self, key: tuple[Any, ...]) -> int:
        """A small int for what a memoized answer depends on besides the cards. Call before a loop:
        it may reset every memo."""
        if len(self._keys) >= 4096 or len(self._contents) >= 100_000 or len(self._shared) >= 200_000:
            self._keys.clear()  # ids are reused after this: forget every memo holding them
            self._fits.clear()
            self._contents.clear()
            self._shared.clear()
        k = self._keys.get(key)
        if k is None:
            k = self._keys[key] = len(self._keys)
        return k

    def _content(self, snap: NodeSnapshot, memo: dict[int, Any]) -> int:
        """Id of the node's card states less the node name (the only thing fit() reads of a card besides
        these fields is its device id, for the UUID annotations: pods with those skip sharing)."""
        cid: int | None = memo.get(-1)
        if cid is None:
            content = tuple((s.card.index, s.card.capacity, s.card.max_slices, s.card.healthy, s.card.cordoned,
                             s.card.cores, s.memory_used, s.cores_used, s.slices_used) for s in snap.states())
            cid = self._contents.get(content)
            if cid is None:
                cid = self._contents[content] = len(self._contents)
            memo[-1] = cid
        return cid

    def _memo(self, name: str, snap: NodeSnapshot) -> dict[int, Any]:
        """The node's memo: valid while the mirror holds the same snapshot with the same cards dict.

        The mirror never edits a cards dict in place: every change installs a new dict (or a new
        snapshot), so two identity checks tell whether anything fit() reads may have changed.
        """
        entry = self._fits.get(name)
        if entry is None or entry[0] is not snap or entry[1] is not snap.cards:
            if entry is None and len(self._fits) > 2 * len(self.mirror.nodes) + 64:
                self._fits = {n: e for n, e in self._fits.items() if n in self.mirror.nodes}
            entry = self._fits[name] = (snap, snap.cards, {})
        return entry[2]

    # -- verbs ---------------------------------------------------------------------------------

    def filter(self, args: dict[str, Any]) -> dict[str, Any]:
        pod = args.get("Pod") or {}
        names: list[str] = list(args.get("NodeNames") or [])
        full_nodes = (args.get("Nodes") or {}).get("items") if not names else None
        if full_nodes is not None:  # a caller that is not node-cache-capable sends (and expects) Node objects
            names = [str((n.get("metadata") or {}).get("name")) for n in full_nodes]
        result = self._filter(pod, names)
        if full_nodes is not None:
            keep = set(result["NodeNames"])
            result["Nodes"] = {"items": [n for n in full_nodes if (n.get("metadata") or {}).get("name") in keep]}
            result["NodeNames"] = None
        return result

    def _filter(self, pod: dict[str, Any], names: list[str]) -> dict[str, Any]:
        try:
            req = pod_request(pod, self.cfg)
        except RequestError as e:
            # Fail closed: a pod that asks for cards but asks wrongly is placed nowhere.
            msg = "; ".join(e.problems)
            self.event(pod, "FilteringFailed", msg, "Warning")
            return {"NodeNames": [], "FailedNodes": {}, "FailedAndUnresolvableNodes": dict.fromkeys(names, msg),
                    "Error": ""}
        if req is None:
            return {"NodeNames": names, "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": ""}
        self._remember(pod)
        annotations = self._annotations(pod)
        ok: list[str] = []
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        # everything fit() reads besides the card states
        key = self._key(("fit", req, annotations.get(USE_UUID), annotations.get(NOUSE_UUID),
                         annotations.get(GPU_POLICY), self.cfg.gpu_scheduler_policy))
        share = not (annotations.get(USE_UUID) or annotations.get(NOUSE_UUID))
        get, fits, memo_of = self.mirror.get, self._fits, self._memo  # hot loop: hundreds of nodes per call
        for name in names:
            snap = get(name)
            if snap is None:
                unresolvable[name] = "node unregistered"
            elif snap.error:
                unresolvable[name] = f"node unregistered: {snap.error}"
            else:
                entry = fits.get(name)
                memo = entry[2] if entry is not None and entry[0] is snap and entry[1] is snap.cards \
                    else memo_of(name, snap)
                result: FitResult | None = memo.get(key)
                if result is None:
                    if len(memo) >= 64:
                        memo.clear()
                    if share:
                        shared_key = (self._content(snap, memo), key)
                        result = self._shared.get(shared_key)
                        if result is None:
                            result = self._shared[shared_key] = fit(snap.states(), req, annotations,
                                                                    self.cfg.gpu_scheduler_policy)
                    else:
                        result = fit(snap.states(), req, annotations, self.cfg.gpu_scheduler_policy)
                    memo[key] = result
                if result.cards:  # result.ok
                    ok.append(name)
                else:
                    failed[name] = result.reason
        if not ok:
            msgs = aggregate_failures({**failed, **unresolvable})
            self.event(pod, "FilteringFailed", "; ".join([*msgs, f"no available node, {len(names)} nodes do not meet"]),
                       "Warning")
        return {"NodeNames": ok, "FailedNodes": failed, "FailedAndUnresolvableNodes": unresolvable, "Error": ""}

    def prioritize(self, args: dict[str, Any]) -> list[dict[str, Any]]:
        pod = args.get("Pod") or {}
        names = list(args.get("NodeNames") or [])
        policy = policy_of(self._annotations(pod), NODE_POLICY, self.cfg.node_scheduler_policy)
        key = self._key(("priority", policy))
        out = []
        get, fits, memo_of = self.mirror.get, self._fits, self._memo
        for name in names:
            snap = get(name)
            score = 0
            if snap:
                entry = fits.get(name)
                memo = entry[2] if entry is not None and entry[0] is snap and entry[1] is snap.cards \
                    else memo_of(name, snap)
                score = memo.get(key, -1)
                if score < 0:
                    if len(memo) >= 64:
                        memo.clear()
                    shared_key = (self._content(snap, memo), key)
                    score = self._shared.get(shared_key, -1)
                    if score < 0:
                        score = self._shared[shared_key] = extender_priority(snap.states(), policy)
                    memo[key] = score
            out.append({"Host": name, "Score": int(score)})
        return out

    async def bind(self, args: dict[str, Any]) -> dict[str, Any]:
        ns, name, uid, node = (str(args.get(k) or "") for k in ("PodNamespace", "PodName", "PodUID", "Node"))
        if not (ns and name and uid and node):
            return {"Error": "bind: PodNamespace, PodName, PodUID and Node are required"}
        pod = self.pods.pop(uid, None)
        if pod is None:
            if self.kube is None:
                return {"Error": f"bind: pod {ns}/{name} was not seen by this replica's filter"}
            try:
                pod = await self.kube.get_pod(ns, name)  # filter ran on another replica
            except KubeError as e:
                BINDINGS.labels("error").inc()
                return {"Error": f"bind: cannot read pod {ns}/{name}: {e}"}
        try:
            req = pod_request(pod, self.cfg)
        except RequestError as e:
            BINDINGS.labels("rejected").inc()
            return {"Error": "; ".join(e.problems)}
        if req is None:
            return await self._plain_bind(pod, ns, name, uid, node)
        outcome, _ = await self.ledger.place(node, uid, req, self._annotations(pod), self.mirror.get(node),
                                                  self.cfg.gpu_scheduler_policy, pod=f"{ns}/{name}")
        if outcome.attempts > 1:
            CONFLICTS.inc(outcome.attempts - 1)
        if not outcome.ok:
            RESERVATIONS.labels("refused").inc()
            BINDINGS.labels("failed").inc()
            msg = f"no card on {node} for {ns}/{name}: {outcome.reason}"
            self.event(pod, "BindingFailed", msg, "Warning")
            return {"Error": msg}
        RESERVATIONS.labels("existing" if outcome.existing else "booked").inc()
        snap = self.mirror.get(node)
        capacity = 0
        if snap and outcome.cards and outcome.cards[0] in snap.cards:
            capacity = snap.cards[outcome.cards[0]].capacity
        if req.whole_cards and not capacity:
            capacity = req.model or 0
        grants = self._grants(node, req, outcome.cards, capacity or req.memory)
        annotations = binding_annotations(node, grants, time.time_ns())
        try:
            if self.kube is None:
                raise KubeError(503, "no API client", "bind")
            await self.kube.bind(ns, name, uid, node, annotations)
        except Exception as e:
            if await self._already_bound(ns, name, uid, node, annotations):
                await self.ledger.mark_bound(node, uid)
                BINDINGS.labels("success").inc()
                return {"Error": ""}
            await self.ledger.release(node, uid)
            BINDINGS.labels("failed").inc()
            msg = f"binding {ns}/{name} to {node} failed, reservation released: {e}"
            self.event(pod, "BindingFailed", msg, "Warning")
            return {"Error": msg}
        await self.ledger.mark_bound(node, uid)
        BINDINGS.labels("success").inc()
        cards = ",".join(str(i) for i in outcome.cards)
        self.event(pod, "BindingSucceed", f"Successfully binding node [{node}] to {ns}/{name} (cards {cards})")
        return {"Error": ""}

    async def _already_bound(self, ns: str, name: str, uid: str, node: str, annotations: dict[str, str]) -> bool:
        """A retried bind whose first attempt succeeded: the pod is on this node with this record."""
        if self.kube is None:
            return False
        try:
            pod = await self.kube.get_pod(ns, name)
        except KubeError:
            return False
        meta = pod.get("metadata") or {}
        return bool(meta.get("uid") == uid and (pod.get("spec") or {}).get("nodeName") == node
                    and (meta.get("annotations") or {}).get(ALLOCATED) == annotations[ALLOCATED])

    async def _plain_bind(self, pod: dict[str, Any], ns: str, name: str, uid: str, node: str) -> dict[str, Any]:
        """Pods that reach bind without asking for slices (not ours): bind them unchanged."""
        try:
            if self.kube is None:
                raise KubeError(503, "no API client", "bind")
            await self.kube.bind(ns, name, uid, node, {})
        except Exception as e:
            return {"Error": f"binding {ns}/{name} to {node} failed: {e}"}
        return {"Error": ""}

    # -- HTTP ----------------------------------------------------------------------------------

    async def _read(self, request: web.Request) -> dict[str, Any] | None:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return None
        return body if isinstance(body, dict) else None

    async def h_filter(self, request: web.Request) -> web.Response:
        with EXTENDER_SECONDS.labels("filter").time():
            args = await self._read(request)
            if args is None:
                return _json({"Error": "filter: body is not ExtenderArgs JSON"})
            if not self.mirror.ready.is_set():
                return _json({"Error": "filter: card state not loaded yet (Redis unreachable?)"})
            return _json(self.filter(args))

    async def h_prioritize(self, request: web.Request) -> web.Response:
        with EXTENDER_SECONDS.labels("prioritize").time():
            args = await self._read(request)
            if args is None:
                return _json([], status=400)
            return _json(self.prioritize(args))

    async def h_bind(self, request: web.Request) -> web.Response:
        with EXTENDER_SECONDS.labels("bind").time():
            args = await self._read(request)
            if args is None:
                return _json({"Error": "bind: body is not ExtenderBindingArgs JSON"})
            try:
                return _json(await self.bind(args))
            except Exception as e:  # a Redis outage must come back as an error, not a dropped connection
                log.exception("bind failed")
                BINDINGS.labels("error").inc()
                return _json({"Error": f"bind: {type(e).__name__}: {e}"})

    async def h_ready(self, _: web.Request) -> web.Response:
        ready = self.mirror.ready.is_set()
        return web.Response(text="ok" if ready else "card state not loaded", status=200 if ready else 503)

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/filter", self.h_filter)
        app.router.add_post("/prioritize", self.h_prioritize)
        app.router.add_post("/bind", self.h_bind)
        app.router.add_get("/readyz", self.h_ready)
