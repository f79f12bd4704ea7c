"""The scheduler extender: filter, prioritize and bind for kube-scheduler (extender/v1 wire format).

Filter and prioritize read only the local mirror (no Redis call per node). Bind takes filter's fit for
the chosen node when the node has not changed since (the memo, keyed by (node, seq)), else plans afresh
from the mirror (pure: shared/domain/state.py plan_on), and books the plan's card(s) atomically in the
ledger (one round trip when the mirror is current; the script checks every card again), creates the
Binding with the allocation annotations in the same API call, answers, and then marks the reservation
bound (off the bind's latency, one round trip for the binds answered on the node within CONFIRM_LINGER:
controller/confirm.py). A failure before the Binding releases the reservation and returns the error (one that may
have come after the Binding was written, a timeout or a 5xx, with the pod unreadable, keeps it pending
instead: the pod may hold the cards); once the Binding exists the bind has succeeded, and a confirmation
that fails is left to the watchers, which book the pod from its record.

Filter returns the best `filterTopK` feasible nodes (shared/domain/topk.py; 0: all). Bookings this replica is
making count in filter and prioritize until the mirror has them (`held`): the reserve script's reply carries
the feed message it published, applied to the mirror at once; with one node returned, filter claims the
card it fitted there until the bind arrives (kube-scheduler schedules the next pod before that bind).

Arguments are checked before anything else (shared/domain/extender_args.py): malformed ones get HTTP 400
naming the field. Bind places only pods that ask for our cards, under our profile, on a node they
may go to (shared/domain/placement.py); anything else is refused before a reservation is made. Every
cache here is bounded by bytes (docs/install.md, Security).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from controller.confirm import Confirmations
from controller.explain import explain_handler
from controller.fit_memo import FitMemo, Held, held_states, request_size
from controller.in_flight import CLAIM_SECONDS, InFlight
from controller.preempt import Preemption
from controller.ranking import Ranking
from shared.config import Config
from shared.domain.admission import placement_request
from shared.domain.annotations import ALLOCATED, CardGrant, binding_annotations, device_id
from shared.domain.extender_args import ArgsError, ExtenderArgs, parse_binding_args, parse_extender_args
from shared.domain.fit import (
    FIT_ANNOTATIONS,
    NODE_POLICY,
    FitResult,
    aggregate_failures,
    fit,
    policy_of,
)
from shared.domain.models import UNIT_MIB
from shared.domain.placement import BindCandidate, NodeRequirement, bind_refusal, node_requirement, scheduler_refusal
from shared.domain.preempt import pod_priority
from shared.domain.request import RequestError, SliceRequest
from shared.domain.shapes import ShapeError, listed
from shared.domain.state import plan_on
from shared.domain.timing import BIND_MIN_LEFT_S, BIND_READ_S, BIND_SETTLE_S, KEEP_MS, bind_deadline_s
from shared.domain.trust import refusal_problem, refused_by_own_policy
from shared.kube import Kube, KubeError, NotSent
from shared.serving.bounded import ByteLRU
from shared.serving.http import BodyError, read_body
from shared.serving.listen import LISTEN_POLICY, extender_policy
from shared.serving.metrics import (
    BIND_DEADLINE_MISSED,
    BINDINGS,
    CONFLICTS,
    EXTENDER_ERRORS,
    EXTENDER_SECONDS,
    RELEASES,
    RESERVATIONS,
    TOPK_DROPPED,
    count_filter_failures,
)
from shared.store.ledger import UNVERIFIED, Ledger, ReserveOutcome
from shared.store.mirror import Mirror
from shared.store.placing import place

log = logging.getLogger("mtsched.extender")


BODY_LIMIT = 32 * 1024 * 1024  # client_max_size: ExtenderArgs with a whole NodeList (a larger body gets 413)
POD_CACHE_BYTES = 16 * 1024 * 1024  # pods seen in filter, kept for bind
POD_ENTRY_BYTES = 256 * 1024  # a larger entry is not kept: bind reads that pod from the API server
EVENT_MEMO_BYTES = 2 * 1024 * 1024  # (pod, reason, message) of recent events, to send each once a minute
# At most EVENT_BURST events of one reason on one pod a minute, whatever their messages: under churn a pending pod's
# FilteringFailed text changes from one filter to the next (which nodes lack what), and each text was an event per
# filter, where kube-scheduler rate-limits its own events per object (tests/e2e/test_redteam_flood_events.py)
EVENT_BURST = 5
EVENT_SECONDS = 60.0
MEMO_BYTES = 32 * 1024 * 1024  # fit and score memos (checked before each call; one call adds at most its nodes)
UNKEPT_WAKE_MAX = 256  # nodes woken once the ledger is kept again (kept_again): one each for most pods turned away
# how long a node where a booking was refused `node unverified` (here, or by another replica: its verify notice)
# is ranked last: the watchers verify it a keep window after their first comparison, which that refusal asks for
UNVERIFIED_RANK_SECONDS = KEEP_MS / 1000
# What the answers name of a pod's request problems (shared.domain.shapes.listed): the filter answers its text for
# every node of the call, and all of them (one per container and resource: 1,024 containers) made 63 KB a node, a
# filter answer of 327 MB at 5,000 nodes (red team)
REQUEST_LISTED = (2, "; ", 400)  # (a problem says what is allowed: up to ~300 characters)


def request_problems(e: RequestError) -> str:
    return listed(e.problems, *REQUEST_LISTED)


EVENT_MESSAGE_CHARS = 1024  # what an event keeps of a message (Kube.create_event cuts there too)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def _bad(e: ArgsError) -> web.Response:
    return _json({"error": str(e)}, status=400)


def _refused(e: BaseException) -> bool:
    """Whether a failed Binding call is known not to have written the Binding: the API server answered
    with a client error (403, 404, 422, ...; not 409, which a Binding that exists answers too, nor 408),
    or no connection was made. A timeout, a lost connection or a 5xx may come after the write."""
    if isinstance(e, aiohttp.ClientConnectorError | aiohttp.ConnectionTimeoutError | NotSent):
        return True  # no connection was made, or none in time: nothing was sent
    return isinstance(e, KubeError) and 400 <= e.status < 500 and e.status not in (408, 409)


def _rejected(e: BaseException) -> bool:
    """Whether the API server turned this Binding call down, so that it will never write it: refused, or a
    conflict (409: the pod is bound already, being deleted, or another pod by now)."""
    return _refused(e) or (isinstance(e, KubeError) and e.status == 409)


@dataclass(frozen=True)
class Seen:
    """What bind needs of a pod (never the whole pod: one annotation can be a megabyte)."""

    uid: str
    name: str
    namespace: str
    scheduler_name: str
    request: SliceRequest | None
    annotations: Mapping[str, str]  # FIT_ANNOTATIONS only
    requirement: NodeRequirement
    priority: int = 0  # spec.priority: the nominated pods it leaves room for (controller/nominations.py)

    @classmethod
    def of(cls, pod: Mapping[str, Any], req: SliceRequest | None, requirement: NodeRequirement) -> Seen:
        meta = pod.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        return cls(str(meta.get("uid") or ""), str(meta.get("name") or ""), str(meta.get("namespace") or ""),
                   str((pod.get("spec") or {}).get("schedulerName") or ""), req,
                   {k: annotations[k] for k in FIT_ANNOTATIONS if k in annotations}, requirement, pod_priority(pod))

    def size(self) -> int:
        """Bytes this entry keeps alive, an upper bound (strings plus the objects around them: measured in
        tests/unit/test_bounded_memory.py)."""
        return (640 + len(self.uid) + len(self.name) + len(self.namespace) + len(self.scheduler_name)
                + sum(64 + len(k) + len(v) for k, v in self.annotations.items())
                + request_size(self.request) + self.requirement.size())

    @property
    def candidate(self) -> BindCandidate:
        return BindCandidate(self.namespace, self.name, self.request is not None, self.scheduler_name,
                             self.requirement)

    @property
    def event_pod(self) -> dict[str, Any]:
        """All Kube.create_event reads of a pod."""
        return {"metadata": {"name": self.name, "namespace": self.namespace, "uid": self.uid}}


class Extender(InFlight):
    """The verbs; what is in flight between them, and the wakes it owes, is InFlight's (controller/in_flight.py)."""

    def __init__(self, cfg: Config, ledger: Ledger, mirror: Mirror, kube: Kube | None):
        super().__init__(cfg, ledger, mirror, kube)
        self.pods: ByteLRU[str, Seen] = ByteLRU(POD_CACHE_BYTES, POD_ENTRY_BYTES)  # uid -> pod seen in filter
        self._events: set[asyncio.Task[None]] = set()
        # answered binds' bookings marked bound after the answer, in batches per node (controller/confirm.py)
        self.confirms = Confirmations(ledger, self._pod_here)
        self._recent: ByteLRU[tuple[str, str, str], float] = ByteLRU(EVENT_MEMO_BYTES)  # -> last sent
        self._bursts: ByteLRU[tuple[str, str], tuple[float, int]] = ByteLRU(EVENT_MEMO_BYTES // 4)  # -> minute, sent
        self.memo = FitMemo(mirror, MEMO_BYTES)  # fit() answers and node scores (controller/fit_memo.py)
        self.ranking = Ranking(mirror)  # every node in the node policy's order (controller/ranking.py)
        # node -> until when it is ranked last (a booking there was refused `node unverified`: unverified_seen)
        self._unverified: dict[str, float] = {}
        mirror.on_notice["verify"].append(self.unverified_seen)  # another replica's refusal
        # from the start of a reservation to the API server's deadline for its Binding (shared/domain/timing.py)
        self.bind_deadline = bind_deadline_s(cfg.pending_ttl_seconds)
        # why no slice pod may be placed now: no watcher keeps the ledger current (controller/upkeep.py, set by
        # the role; "" when one does)
        self.unkept: Callable[[], str] = lambda: ""
        # (when, message) of the last Binding the chart's admission policy refused for who we are, since the last one
        # that went through (bindings_problem)
        self._refused_by_policy: tuple[float, str] | None = None

    # -- helpers -------------------------------------------------------------------------------

    def _remember(self, seen: Seen) -> None:
        self.pods.put(seen.uid, seen, seen.size())

    def event(self, pod: Mapping[str, Any], reason: str, message: str, kind: str = "Normal") -> None:
        """Fire-and-forget Kubernetes event, so API latency never adds to a scheduling call."""
        if not (self.kube and self.cfg.events_enabled):
            return
        message = message[:EVENT_MESSAGE_CHARS]
        # kube-scheduler retries a Pending pod often: one event per pod, reason and message a minute
        key = (str((pod.get("metadata") or {}).get("uid")), reason, message)
        now = time.monotonic()
        last = self._recent.get(key)
        if last is not None and now - last < EVENT_SECONDS:
            return
        since, sent = self._bursts.get(key[:2]) or (now, 0)
        if now - since >= EVENT_SECONDS:
            since, sent = now, 0
        if sent >= EVENT_BURST:
            return
        self._bursts.put(key[:2], (since, sent + 1), 200 + len(key[0]) + len(reason))
        self._recent.put(key, now, 160 + len(key[0]) + len(reason) + len(message))

        async def send() -> None:
            try:
                await self.kube.create_event(pod, reason, message, kind, self.cfg.scheduler_name)  # type: ignore[union-attr]
            except Exception as e:
                log.debug("event %s not recorded: %s", reason, e)

        task = asyncio.create_task(send())
        self._events.add(task)
        task.add_done_callback(self._events.discard)

    def _grants(self, node: str, req: SliceRequest, cards: tuple[int, ...], capacity: int) -> list[list[CardGrant]]:
        return [[CardGrant(device_id(node, i), s.memory * UNIT_MIB, s.cores) for i in cards] if not s.empty else []
                for s in req.shares_for(capacity)]

    def _capacity(self, node: str, req: SliceRequest, outcome: ReserveOutcome) -> int:
        """Units per booked card: the plan's; only an earlier booking on other cards than planned (its
        capacity unknown to the plan) is looked up in the mirror."""
        if outcome.capacity:
            return outcome.capacity
        snap = self.mirror.get(node)
        record = snap.cards.get(outcome.cards[0]) if snap is not None and outcome.cards else None
        if record is not None and record.capacity:
            return record.capacity
        return (req.model or req.memory) if req.whole_cards else req.memory

    # -- verbs ---------------------------------------------------------------------------------

    def filter(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """ExtenderFilterResult for ExtenderArgs; ArgsError (HTTP 400) when they are malformed."""
        a = parse_extender_args(args, self.mirror.nodes.keys())
        if not self.mirror.ready.is_set():
            return {"Error": "filter: card state not loaded yet (Redis unreachable?)"}
        result = self._filter(a)
        if a.nodes is not None:  # a caller that is not node-cache-capable sends (and expects) Node objects
            keep = set(result["NodeNames"])
            result["Nodes"] = {"items": [n for n, name in zip(a.nodes, a.names, strict=True) if name in keep]}
            result["NodeNames"] = None
        return result

    def _filter(self, a: ExtenderArgs) -> dict[str, Any]:
        pod, names = a.pod, list(a.names)
        meta = pod["metadata"]
        event_pod = {"metadata": {k: meta[k] for k in ("name", "namespace", "uid")}}  # not the pod: events wait
        try:
            req = placement_request(pod, self.cfg)
        except RequestError as e:
            # Fail closed: a pod that asks for cards but asks wrongly is placed nowhere.
            msg = request_problems(e)
            self.event(event_pod, "FilteringFailed", msg, "Warning")
            return {"NodeNames": [], "FailedNodes": {}, "FailedAndUnresolvableNodes": dict.fromkeys(names, msg),
                    "Error": ""}
        if req is None:
            return {"NodeNames": names, "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": ""}
        seen = Seen.of(pod, req, a.requirement)
        why = scheduler_refusal(seen.scheduler_name, self.cfg.scheduler_name, self.cfg.resource_count_name)
        if why:
            self.event(event_pod, "FilteringFailed", why, "Warning")
            return {"NodeNames": [], "FailedNodes": {}, "FailedAndUnresolvableNodes": dict.fromkeys(names, why),
                    "Error": ""}
        unkept = self.unkept()
        if unkept:
            if names and len(self._unkept_wake) < UNKEPT_WAKE_MAX:  # beyond: kube-scheduler's own 5-minute retry
                self._unkept_wake.add(min(names))
            self.event(event_pod, "FilteringFailed", unkept, "Warning")
            return {"NodeNames": [], "FailedNodes": {}, "FailedAndUnresolvableNodes": dict.fromkeys(names, unkept),
                    "Error": ""}
        self._remember(seen)
        if self._claims:
            self._prune_claims()
            # a pod's own claim never counts against it; filtered again, its last attempt ended without a bind
            self._unclaim(seen.uid, lapsed=True)
        nominated = (pod.get("status") or {}).get("nominatedNodeName")
        if isinstance(nominated, str) and nominated:  # kube-scheduler chose this node for its preemption
            self.nominate(seen.uid, seen.priority, req, seen.annotations, [nominated])
            self.follow(seen.namespace, seen.name, seen.uid)  # until it binds or goes (an extender restarted)
        elif seen.uid in self.nominations.by_uid:  # nominated no more (kube-scheduler cleared it): it holds nothing
            self._woken(self.nominations.forget(seen.uid))
        held = self._held_for(seen.uid, seen.priority)
        k, gpu_policy = self.cfg.filter_top_k, self.cfg.gpu_scheduler_policy
        if 0 < k < len(names):
            # best first by the node policy, fitted until k fit: the same nodes as top_k over every fitting
            # node (shared/domain/topk.py), without fitting the rest. Those are left out of both lists:
            # kube-scheduler drops them without a status.
            policy = policy_of(meta.get("annotations") or {}, NODE_POLICY, self.cfg.node_scheduler_policy)
            best = self.ranking.best_first(a.candidates, policy, held)  # the nodes the mirror holds
            if self._unverified:
                best = self._verified_first(best)
            ok, failed, unresolvable = self.memo.fit_nodes(best, req, seen.annotations, gpu_policy, held, limit=k)
            unlisted = [n for n in names if n not in self.mirror.nodes] if not ok else []
            if unlisted:  # none fits: every node is reported, unregistered too
                # (next to the snapshots with an error the first pass found unresolvable, not in their place)
                unresolvable.update(self.memo.fit_nodes(unlisted, req, seen.annotations, gpu_policy, held)[2])
            TOPK_DROPPED.inc(len(names) - len(failed) - len(unresolvable) - len(ok))
        else:
            ok, failed, unresolvable = self.memo.fit_nodes(names, req, seen.annotations, gpu_policy, held)
        if self._unverified and len(ok) > 1:
            # a node that books nothing now (unverified_seen) is left out, as top-k leaves nodes out (no status:
            # another node fits, so kube-scheduler reads none), while another node fits
            verified = [n for n in ok if not self._is_unverified(n)]
            if verified:
                ok = verified
        if len(ok) == 1:
            self._claim(ok[0], seen, held)
        if k and ok:
            # kube-scheduler reads failed nodes' statuses only when no node is feasible (the "0/N nodes"
            # message, preemption): with a node returned they are not sent (no text made, none decoded)
            return {"NodeNames": ok, "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": ""}
        if not ok:
            if held:  # placed nowhere, perhaps for cards held here: woken if a claim or nomination ends unused
                self._turned_away.update(n for n in held if n in failed or n in unresolvable)
            msgs = aggregate_failures({**failed, **unresolvable})
            count_filter_failures(failed, unresolvable)
            self.event(event_pod, "FilteringFailed",
                       "; ".join([*msgs, f"no available node, {len(names)} nodes do not meet"]), "Warning")
        # the edge: card counts become HAMi's "N/M Reason" text here
        return {"NodeNames": ok, "FailedNodes": {n: r.text for n, r in failed.items()},
                "FailedAndUnresolvableNodes": unresolvable, "Error": ""}

    def prioritize(self, args: Mapping[str, Any]) -> list[dict[str, Any]]:
        """HostPriorityList for ExtenderArgs; ArgsError (HTTP 400) when they are malformed."""
        a = parse_extender_args(args, self.mirror.nodes.keys())
        meta = a.pod["metadata"]
        policy = policy_of(meta.get("annotations") or {}, NODE_POLICY, self.cfg.node_scheduler_policy)
        # as the filter ranked them: with the pods nominated ahead of this one placed (_held_for)
        return self.memo.scores(a.names, policy, self._held_for(str(meta.get("uid") or ""), pod_priority(a.pod)))

    def unverified_seen(self, node: str) -> None:
        """A booking on `node` was refused `node unverified` (Redis failed over or restarted with data, and the
        watchers have not compared the node with the API since): every booking there is refused until they have,
        a keep window after their first comparison. Until then the filter leaves it out when another node fits
        (the top-k filter tries it last), so kube-scheduler's next attempt goes to a node that books; alone, it
        is still returned (refused at bind, kube-scheduler retries after its backoff, as before). Without this
        the packing policy sent the pod back to the same node, refused again, for as long as verifying took."""
        now = time.monotonic()
        if len(self._unverified) >= 4096:  # bounded: forget the lapsed ones
            self._unverified = {n: t for n, t in self._unverified.items() if t > now}
        self._unverified[node] = now + UNVERIFIED_RANK_SECONDS

    def _is_unverified(self, node: str) -> bool:
        until = self._unverified.get(node)
        if until is None:
            return False
        if until > time.monotonic():
            return True
        del self._unverified[node]
        return False

    def _verified_first(self, nodes: Iterator[str]) -> Iterator[str]:
        """`nodes` in their order, the ones ranked last (unverified_seen) after all others."""
        later = []
        for n in nodes:
            if self._is_unverified(n):
                later.append(n)
            else:
                yield n
        yield from later

    async def _seen_from_api(self, ns: str, name: str, uid: str) -> Seen | str:
        """The pod as the API server has it (filter ran on another replica), or why bind must stop."""
        if self.kube is None:
            return f"bind: pod {ns}/{name} was not seen by this replica's filter"
        try:
            async with asyncio.timeout(BIND_READ_S):
                pod = await self.kube.get_pod(ns, name)  # filter ran on another replica
        except (KubeError, TimeoutError, aiohttp.ClientError) as e:
            BINDINGS.labels("error").inc()
            return f"bind: cannot read pod {ns}/{name}: {e if isinstance(e, KubeError) else f'{type(e).__name__}: {e}'}"
        got = (pod.get("metadata") or {}).get("uid") if isinstance(pod, dict) else None
        if got != uid:
            BINDINGS.labels("rejected").inc()
            return f"bind: pod {ns}/{name} has uid {got!r}, not {uid!r} (deleted and created again?)"
        try:  # placement_request checks the pod's shape first
            return Seen.of(pod, placement_request(pod, self.cfg), node_requirement(pod))
        except (RequestError, ShapeError) as e:
            BINDINGS.labels("rejected").inc()
            return request_problems(e) if isinstance(e, RequestError) else str(e)

    async def _node_labels(self, node: str) -> tuple[Mapping[str, str] | None, str]:
        """The node's labels from the API server (the mirror has cards, not labels), or why not."""
        if self.kube is None:
            return None, "no API client"
        try:
            async with asyncio.timeout(BIND_READ_S):
                obj = await self.kube.get_node(node)
        except (KubeError, TimeoutError, aiohttp.ClientError) as e:
            return None, str(e) if isinstance(e, KubeError) else f"{type(e).__name__}: {e}"
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        labels = meta.get("labels") if isinstance(meta, dict) else None
        if labels is not None and not isinstance(labels, dict):
            return None, "the node's labels are not an object"
        return {k: v for k, v in (labels or {}).items() if isinstance(v, str)}, ""

    async def bind(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """ExtenderBindingResult for ExtenderBindingArgs; ArgsError (HTTP 400) when they are malformed."""
        b = parse_binding_args(args)
        ns, name, uid, node = b.namespace, b.name, b.uid, b.node
        seen = self.pods.pop(uid)
        if seen is not None and (seen.namespace, seen.name) != (ns, name):
            BINDINGS.labels("rejected").inc()
            return {"Error": f"bind: pod uid {uid} was filtered as {seen.namespace}/{seen.name}, not {ns}/{name}"}
        if seen is None:
            got = await self._seen_from_api(ns, name, uid)
            if isinstance(got, str):
                return {"Error": got}
            seen = got
        labels, why_not = None, ""
        if not seen.requirement.unconstrained:
            labels, why_not = await self._node_labels(node)
        refusal = bind_refusal(seen.candidate, node, labels, self.cfg.scheduler_name, self.cfg.resource_count_name)
        if refusal:  # before any reservation: nothing to release
            BINDINGS.labels("rejected").inc()
            msg = f"{refusal} ({why_not})" if why_not else refusal
            self.event(seen.event_pod, "BindingFailed", msg, "Warning")
            return {"Error": msg}
        refusal = self.unkept()
        if refusal:  # filtered before the stamp aged: nothing is booked on a ledger nobody keeps
            BINDINGS.labels("rejected").inc()
            self.event(seen.event_pod, "BindingFailed", refusal, "Warning")
            return {"Error": refusal}
        req = seen.request
        assert req is not None  # bind_refusal refuses pods without a request
        pod = seen.event_pod
        policy = self.cfg.gpu_scheduler_policy
        snap = self.mirror.get(node)
        plan = None
        others = {u: b for u, b in self._held_for(uid, seen.priority, only=node).get(node, {}).items() if u != uid}
        if snap is not None and not snap.error:  # filter's fit at the same seq, else a fresh one
            fitted: FitResult | None = None
            if others:  # cards other binds are booking right now: plan around them (when that fits)
                around = fit(held_states(snap, others), req, seen.annotations, policy)
                fitted = around if around.ok else None
            else:
                fitted = self.memo.fitted(node, snap, req, seen.annotations, policy)
            plan = plan_on(snap, uid, req, seen.annotations, policy, fitted)
        # filter's claim (if any) becomes the booking in flight; a claim on another node ends unused there
        claimed = self._claims.get(uid)
        self._unclaim(uid, lapsed=claimed is not None and claimed[0] != node)
        held = self.held.setdefault(node, {})
        if plan is not None and plan.ok:
            held[uid] = (req, plan.cards)
        booked = False
        started = time.monotonic()  # the Binding's deadline counts from here (shared/domain/timing.py)
        try:
            # held in Redis until this attempt's Binding is committed or never: a later attempt of the pod
            # (`existing`) stamps its own, so an earlier one's give-back and the janitor leave it alone
            outcome, _ = await place(self.ledger, node, uid, req, seen.annotations, snap, policy,
                                     pod=f"{ns}/{name}", plan=plan, hold_ms=self._hold_ms)
            booked = outcome.ok
            if booked and self.nominations:  # bound here: nominated no more (its booking holds the cards)
                self._woken(self.nominations.forget(uid) - {node})
            held = self.held.setdefault(node, held)  # the same dict, unless emptied and dropped meanwhile
            if booked and (uid not in held or held[uid][1] != outcome.cards):
                held[uid] = (req, outcome.cards)  # booked on other cards than planned: hold those
            if outcome.feed is not None:  # our booking in the mirror now, not when the feed brings it
                self._apply_feed(outcome.feed)
        finally:
            snap = self.mirror.get(node)
            if booked and not (snap is not None and uid in snap.reservations):
                # booked, but the mirror lags the feed (a gap: our message was not applied): hold the
                # booking until the feed brings it (the snapshot has it) or CLAIM_SECONDS pass
                self._claims[uid] = (node, time.monotonic() + CLAIM_SECONDS)
            else:
                held.pop(uid, None)
                if not held and self.held.get(node) is held:
                    del self.held[node]
                if node not in self.held:  # nothing held there any more: nobody can be turned away for it
                    self._turned_away.discard(node)
        if outcome.attempts > 1:
            CONFLICTS.inc(outcome.attempts - 1)
        if not outcome.ok:
            if outcome.refused.startswith(UNVERIFIED):
                self.unverified_seen(node)
                self._notify("verify", node)  # the watchers compare the node now, not at their next pass
            RESERVATIONS.labels("refused").inc()
            BINDINGS.labels("failed").inc()
            msg = f"no card on {node} for {ns}/{name}: {outcome.reason}"
            self.event(pod, "BindingFailed", msg, "Warning")
            return {"Error": msg}
        RESERVATIONS.labels("existing" if outcome.existing else "booked").inc()
        capacity = self._capacity(node, req, outcome)
        grants = self._grants(node, req, outcome.cards, capacity)
        annotations = binding_annotations(node, grants, time.time_ns())
        until = started + self.bind_deadline  # the API server commits the Binding by then, or never
        if until - time.monotonic() < BIND_MIN_LEFT_S:
            # too late to promise the watchers it is committed within the deadline, or never: not sent. A
            # booking an earlier attempt made (`existing`) stays for it (its Binding may still be in flight): this
            # attempt takes only its own name off, naming no number (release.lua keeps a booking that lists none)
            if outcome.existing and not outcome.attempt:
                self._unclaim(uid)
                fate = "kept for the earlier attempt"
            else:
                fate = await self._give_back(node, uid, 0 if outcome.existing else outcome.bind_no, outcome.attempt)
            BINDINGS.labels("failed").inc()
            BIND_DEADLINE_MISSED.labels("before_send").inc()
            msg = (f"binding {ns}/{name} to {node} not sent: its reservation took {time.monotonic() - started:.1f}s "
                   f"of the {self.bind_deadline:g}s a bind has; reservation {fate}")
            self.event(pod, "BindingFailed", msg, "Warning")
            return {"Error": msg}
        try:
            if self.kube is None:
                raise KubeError(503, "no API client", "bind")
            await self.kube.bind(ns, name, uid, node, annotations, until=until)
        except Exception as e:
            refused_us = self._judge_refusal(e)  # first: whatever the handling below meets
            bound = await self._already_bound(ns, name, uid, node, annotations)
            if bound is False and (outcome.existing or not _rejected(e)):
                # this Binding (or an earlier attempt's, for a booking it made: started before this one, its
                # deadline ends first) may still be committed until the deadline: only a read after it says never
                BIND_DEADLINE_MISSED.labels("unknown_outcome").inc()
                await asyncio.sleep(max(0.0, until + BIND_SETTLE_S - time.monotonic()))
                bound = await self._already_bound(ns, name, uid, node, annotations)
            if bound:
                self.confirms.settle(node, uid, f"{ns}/{name}", req, outcome.cards, capacity)
                BINDINGS.labels("success").inc()
                if not refused_us:  # (bound by an earlier attempt of ours, this one refused: no sign we may bind)
                    self._refused_by_policy = None  # a Binding of ours went through: the policy takes us
                return {"Error": ""}
            if bound is None and (outcome.existing or not _refused(e)):
                # the Binding may exist (the answer was lost, or a 5xx after the write; or an earlier attempt's,
                # which made this booking) and the pod cannot be read: it may run on these cards with its record,
                # so they are not given away. The booking stays pending: a watcher that sees the record marks it
                # bound, else the janitor expires it after pendingTTLSeconds
                self._unclaim(uid)
                BINDINGS.labels("failed").inc()
                msg = (f"binding {ns}/{name} to {node} has an unknown outcome, its reservation is kept until the "
                       f"pod is seen or it expires: {type(e).__name__}: {e}")
                self.event(pod, "BindingFailed", msg, "Warning")
                return {"Error": msg}
            fate = await self._give_back(node, uid, outcome.bind_no, outcome.attempt)
            BINDINGS.labels("failed").inc()
            msg = f"binding {ns}/{name} to {node} failed, reservation {fate}: {e}"
            self.event(pod, "BindingFailed", msg, "Warning")
            return {"Error": msg}
        self.confirms.settle(node, uid, f"{ns}/{name}", req, outcome.cards, capacity)
        BINDINGS.labels("success").inc()
        self._refused_by_policy = None  # a Binding went through: the policy takes us for the scheduler
        cards = ",".join(str(i) for i in outcome.cards)
        if self.cfg.success_events:
            self.event(pod, "BindingSucceed", f"Successfully binding node [{node}] to {ns}/{name} (cards {cards})")
        return {"Error": ""}

    def _judge_refusal(self, e: BaseException) -> bool:
        """Whether a failed Binding call was refused by the chart's admission policy for who we are: then all of ours
        will be (bindings_problem), until one goes through."""
        if not (isinstance(e, KubeError) and refused_by_own_policy(e.status, str(e), self.cfg.scheduler_name)):
            return False
        if self._refused_by_policy is None:
            log.error("bind: the admission policy refuses this extender's Bindings (it is not running as the "
                      "identity the policy names for %s): %s", self.cfg.scheduler_name, e)
        self._refused_by_policy = (time.monotonic(), str(e))
        return True

    def bindings_problem(self) -> str:
        """The readiness check: why Bindings this extender sends are refused whatever the pod (shared/domain/trust.py
        refusal_problem); "" when the last one went through, or no refusal came for a while."""
        return refusal_problem(self._refused_by_policy, time.monotonic())

    async def _give_back(self, node: str, uid: str, bind_no: int, attempt: str) -> str:
        """Release a booking whose Binding (this attempt's: number `bind_no`, named `attempt`) does not exist and
        never will, unless another attempt of the pod holds it (its Binding may still come) or the pod is bound there
        (release.lua).
        kube-scheduler moves every parked pod back to its queues as it gets the failed bind's answer: their next
        filter must see the cards free, so the release is in this mirror now, not when the feed brings it.
        Returns what became of the booking, for the answer."""
        fate, feed = await self.ledger.give_back(node, uid, bind_no or None, attempt=attempt)
        if fate == "released":
            RELEASES.labels("bind_failed").inc()
        if feed is not None:
            self._apply_feed(feed)
        self._unclaim(uid)
        return "kept for another attempt of the pod" if fate == "kept" else "released"

    @property
    def _hold_ms(self) -> int:
        """How long a booking is held for this attempt's Binding (reserve's hold_ms): its deadline, counted
        from before the reservation, and the settle time after it."""
        return int((self.bind_deadline + BIND_SETTLE_S) * 1000)


    async def settled(self, timeout: float = 10.0) -> None:
        """Wait (at most `timeout` s) until the bookings of answered binds are marked bound (Confirmations.settled)."""
        await self.confirms.settled(timeout)

    async def _bound_here(self, ns: str, name: str, uid: str, node: str) -> Mapping[str, str] | None:
        """The annotations of the pod if it exists as this uid bound to `node`, else None (404 included);
        raises KubeError when the API server does not say."""
        pod = await self._pod_here(ns, name, uid, node)
        return None if pod is None else ((pod.get("metadata") or {}).get("annotations") or {})

    async def _pod_here(self, ns: str, name: str, uid: str, node: str) -> Mapping[str, Any] | None:
        """The pod if it exists as this uid bound to `node`, else None (404 included); raises KubeError when
        the API server does not say (no API client: it cannot)."""
        if self.kube is None:
            raise KubeError(503, "no API client", "get pod")
        try:
            async with asyncio.timeout(BIND_READ_S):
                pod = await self.kube.get_pod(ns, name)
        except KubeError as e:
            if e.status == 404:
                return None
            raise
        meta = pod.get("metadata") or {}
        if meta.get("uid") != uid or (pod.get("spec") or {}).get("nodeName") != node:
            return None
        return pod

    def _claim(self, node: str, seen: Seen, others: Held) -> None:
        """One node returned: kube-scheduler binds there (it has no other candidate), and schedules the next
        pod before that bind arrives. Hold the pod's fit on the node meanwhile (until bind, or CLAIM_SECONDS),
        so the next pod's filter does not count the same card as free."""
        now = time.monotonic()
        snap = self.mirror.get(node)
        req = seen.request
        if snap is None or req is None or seen.uid in snap.reservations:
            return
        held, policy = others.get(node), self.cfg.gpu_scheduler_policy
        # nothing else in flight there: the filter's own fit of this snapshot is the answer (memoized)
        result = (None if held else self.memo.fitted(node, snap, req, seen.annotations, policy)) or fit(
            held_states(snap, held or {}), req, seen.annotations, policy)
        if result.cards:
            self.held.setdefault(node, {})[seen.uid] = (req, result.cards)
            self._claims[seen.uid] = (node, now + CLAIM_SECONDS)

    def _apply_feed(self, msg: Mapping[str, Any]) -> None:
        """The reserve script's feed message, applied as the feed would (the feed's copy is then skipped)."""
        try:
            self.mirror.apply(msg)  # a gap (the feed behind): None is not returned, the feed catches up
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            log.debug("booking not applied to the mirror ahead of the feed: %s", e)

    async def _already_bound(self, ns: str, name: str, uid: str, node: str,
                             annotations: dict[str, str]) -> bool | None:
        """A retried bind whose first attempt succeeded: the pod is on this node with this record (True);
        False when it is not; None when the API server does not say (the pod cannot be read)."""
        if self.kube is None:
            return False
        try:
            got = await self._bound_here(ns, name, uid, node)
        except Exception:  # KubeError, a timeout, the network: unknown
            return None
        return got is not None and got.get(ALLOCATED) == annotations[ALLOCATED]

    # -- HTTP ----------------------------------------------------------------------------------

    @staticmethod
    async def _read(request: web.Request, what: str) -> Any:
        """The decoded body; ArgsError when it is not JSON, BodyError when it cannot be read (aiohttp answers
        413 above BODY_LIMIT)."""
        try:
            return orjson.loads(await read_body(request))
        except orjson.JSONDecodeError as e:
            raise ArgsError(f"body: not JSON ({e}); allowed: an {what} JSON object") from None

    async def _answer(self, request: web.Request, verb: str, call: Callable[[Mapping[str, Any]], Any]) -> web.Response:
        """A filter or prioritize call: timed, decoded, answered (400 for malformed arguments)."""
        with EXTENDER_SECONDS.labels(verb).time():
            try:
                return _json(call(await self._read(request, "ExtenderArgs")))
            except ArgsError as e:
                return _bad(e)
            except BodyError as e:
                return _json({"error": e.message}, status=e.status)
            except web.HTTPException:  # aiohttp's own answers (a body over the limit: 413)
                raise
            except Exception as e:  # a bug must come back as an answer that places nothing, not a 500
                log.exception("%s failed", verb)
                EXTENDER_ERRORS.labels(verb).inc()
                # filter: an error, so kube-scheduler retries the pod; prioritize: no score (kube-scheduler
                # ignores an extender's prioritize error anyway, and its answer has no error field)
                return _json({"NodeNames": [], "FailedNodes": {}, "Error": f"{verb}: {type(e).__name__}: {e}"}
                             if verb == "filter" else [])

    async def h_filter(self, request: web.Request) -> web.Response:
        return await self._answer(request, "filter", self.filter)

    async def h_prioritize(self, request: web.Request) -> web.Response:
        return await self._answer(request, "prioritize", self.prioritize)

    async def h_bind(self, request: web.Request) -> web.Response:
        with EXTENDER_SECONDS.labels("bind").time():
            try:
                return _json(await self.bind(await self._read(request, "ExtenderBindingArgs")))
            except ArgsError as e:
                return _bad(e)
            except BodyError as e:
                return _json({"error": e.message}, status=e.status)
            except web.HTTPException:  # aiohttp's own answers (a body over the limit: 413)
                raise
            except Exception as e:  # a Redis outage must come back as an error, not a dropped connection
                log.exception("bind failed")
                BINDINGS.labels("error").inc()
                return _json({"Error": f"bind: {type(e).__name__}: {e}"})

    async def h_ready(self, _: web.Request) -> web.Response:
        ready = self.mirror.ready.is_set()
        return web.Response(text="ok" if ready else "card state not loaded", status=200 if ready else 503)

    def routes(self, app: web.Application) -> None:
        app[LISTEN_POLICY] = extender_policy(self.cfg)
        app.router.add_post("/filter", self.h_filter)
        app.router.add_post("/prioritize", self.h_prioritize)
        app.router.add_post("/bind", self.h_bind)
        app.router.add_post("/preempt", Preemption(self).handle)  # controller/preempt.py
        app.router.add_get("/readyz", self.h_ready)
        # controller/explain.py; the verdict read late: the role sets `unkept` after the routes
        app.router.add_get("/debug/explain", explain_handler(self.cfg, self.kube, self.mirror, lambda: self.unkept()))
