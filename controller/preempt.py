"""The extender's preempt verb: kube-scheduler's victims, reduced to those that free the right card.

kube-scheduler calls it after its own dry run (which counts node totals only), with the victims it
would evict per candidate node; what we answer is what it evicts (an empty answer: nothing). Per node
the pure rule (shared/domain/preempt.py) reads the mirror's card states and reservations (which pod
holds which card). With node-cache-capable arguments the victims come as UIDs: their priorities are
read from the API server (the reservation names the pod); a victim we cannot read counts as the
highest priority a victim can have (the preemptor's minus one), so known-cheaper sets win.
Fail closed: a node the mirror does not know, or a state not loaded yet, gets no eviction.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from shared.domain.extender_args import ArgsError
from shared.domain.preempt import Budget, Choice, Holding, Victim, choose_victims
from shared.domain.preempt_args import NodeVictims, PreemptionArgs, parse_preemption_args
from shared.domain.request import RequestError, SliceRequest, pod_request
from shared.domain.state import NodeSnapshot
from shared.kube import KubeError
from shared.serving.http import BodyError, read_body
from shared.serving.metrics import EXTENDER_SECONDS, PREEMPT_NODES

if TYPE_CHECKING:
    from controller.extender import Extender

log = logging.getLogger("mtsched.preempt")

LOOKUPS = 8  # victims' pods read from the API server at once
# all of one call's reads of victims' priorities: a victim not read by then counts as the ceiling (a read may
# take the Kube client's 30 s, kube-scheduler's httpTimeout for the whole call)
LOOKUP_SECONDS = 2.0
UNKNOWN_NODE = "unknown_node"


def _answer(nodes: Mapping[str, tuple[tuple[str, ...], int]]) -> dict[str, Any]:
    """ExtenderPreemptionResult: always the meta form (kube-scheduler maps UIDs back to its pods)."""
    return {"NodeNameToMetaVictims": {n: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": pdb}
                                      for n, (uids, pdb) in nodes.items()}}


class Preemption:
    def __init__(self, ext: Extender):
        self.ext = ext

    async def _priorities(self, a: PreemptionArgs) -> dict[str, int]:
        """uid -> priority of every victim that holds a card (full pods carry it; UIDs are looked up)."""
        known: dict[str, int] = {}
        lookups: dict[str, str] = {}  # uid -> namespace/name, from the reservation
        for node, victims in a.nodes.items():
            snap = self.ext.mirror.get(node)
            for v in victims.pods:
                if v.priority is not None:
                    known[v.uid] = v.priority
                elif snap is not None and v.uid in snap.reservations and "/" in snap.reservations[v.uid].pod:
                    lookups[v.uid] = snap.reservations[v.uid].pod
        kube = self.ext.kube
        if not lookups or kube is None:
            return known
        gate = asyncio.Semaphore(LOOKUPS)

        async def read(uid: str, ref: str) -> None:
            ns, name = ref.split("/", 1)
            async with gate:
                try:
                    pod = await kube.get_pod(ns, name)
                except KubeError as e:
                    log.debug("victim %s (%s) not read: %s", ref, uid, e)
                    return
            meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
            prio = spec.get("priority")
            if meta.get("uid") == uid and isinstance(prio, int) and not isinstance(prio, bool):
                known[uid] = prio

        try:
            async with asyncio.timeout(LOOKUP_SECONDS):
                await asyncio.gather(*(read(u, r) for u, r in lookups.items()))
        except TimeoutError:
            unread = sum(1 for u in lookups if u not in known)
            log.info("preempt: %d of %d victims' priorities not read within %g s; they count as the highest a "
                     "victim can have", unread, len(lookups), LOOKUP_SECONDS)
        return known

    def _node(self, a: PreemptionArgs, req: SliceRequest, victims: NodeVictims, snap: NodeSnapshot | None,
              prios: Mapping[str, int], budget: Budget) -> Choice:
        if snap is None or snap.error:
            return Choice(UNKNOWN_NODE, reason="node unknown to the card ledger" if snap is None else snap.error)
        holdings = {uid: Holding(r.cards, r.mem, r.cores, r.slices) for uid, r in snap.reservations.items()}
        ceiling = max(a.priority - 1, -(2**31))
        proposed = [Victim(v.uid, prios.get(v.uid, ceiling)) for v in victims.pods]
        annotations = a.pod["metadata"].get("annotations") or {}
        return choose_victims(snap.states(), holdings, proposed, req, annotations, self.ext.cfg.gpu_scheduler_policy,
                              budget)

    async def preempt(self, doc: object) -> dict[str, Any]:
        """ExtenderPreemptionResult for ExtenderPreemptionArgs; ArgsError (HTTP 400) when malformed."""
        a = parse_preemption_args(doc)
        meta = a.pod["metadata"]
        ref = f"{meta['namespace']}/{meta['name']}"
        event_pod = {"metadata": {k: meta[k] for k in ("name", "namespace", "uid")}}
        try:
            req = pod_request(a.pod, self.ext.cfg)
        except RequestError as e:  # the filter placed it nowhere; nothing is evicted for it either
            PREEMPT_NODES.labels("bad_request").inc(len(a.nodes))
            log.info("preempt for %s: no eviction, its request is invalid: %s", ref, "; ".join(e.problems))
            return _answer({})
        if req is None:  # asks no card: the cards have no say, kube-scheduler's choice stands
            PREEMPT_NODES.labels("no_request").inc(len(a.nodes))
            return _answer({n: (tuple(v.uid for v in nv.pods), nv.pdb_violations) for n, nv in a.nodes.items()})
        if not self.ext.mirror.ready.is_set():
            PREEMPT_NODES.labels("not_ready").inc(len(a.nodes))
            log.warning("preempt for %s: card state not loaded yet, no eviction", ref)
            return _answer({})
        prios = await self._priorities(a)
        out: dict[str, tuple[tuple[str, ...], int]] = {}
        refused: list[str] = []
        chosen: list[str] = []
        budget = Budget()  # one for the call: its searches are bounded however many nodes it carries
        for i, (node, victims) in enumerate(a.nodes.items()):
            if i:
                await asyncio.sleep(0)  # filter and bind share the event loop: let them in between nodes
            choice = self._node(a, req, victims, self.ext.mirror.get(node), prios, budget)
            PREEMPT_NODES.labels(choice.outcome).inc()
            if not choice.victims:
                refused.append(f"{node}: {choice.reason}")
                continue
            # kube-scheduler's count of PDB violations was for its whole set: an upper bound for ours
            out[node] = (choice.victims, min(victims.pdb_violations, len(choice.victims)))
            cards = ",".join(map(str, choice.cards)) or "as proposed"
            chosen.append(f"{node} cards {cards}: {len(choice.victims)} of {len(victims.pods)} victims")
        log.info("preempt for %s: %d of %d nodes kept (%s); dropped: %s", ref, len(out), len(a.nodes),
                 "; ".join(chosen) or "none", "; ".join(refused) or "none")
        if out:
            self.ext.event(event_pod, "PreemptionCardChosen", "evicting only victims that free a card: "
                           + "; ".join(chosen))
        else:
            self.ext.event(event_pod, "PreemptionNotHelpful", "no card would be freed by evicting the proposed "
                           "victims: " + "; ".join(refused), "Warning")
        return _answer(out)

    async def handle(self, request: web.Request) -> web.Response:
        with EXTENDER_SECONDS.labels("preempt").time():
            try:
                try:
                    doc = orjson.loads(await read_body(request))
                except orjson.JSONDecodeError as e:
                    raise ArgsError(f"body: not JSON ({e}); allowed: an ExtenderPreemptionArgs JSON object") from None
                body = await self.preempt(doc)
            except ArgsError as e:
                return web.Response(body=orjson.dumps({"error": str(e)}), status=400, content_type="application/json")
            except BodyError as e:
                return web.Response(body=orjson.dumps({"error": e.message}), status=e.status,
                                    content_type="application/json")
            except Exception:  # fail closed: no eviction rather than a 500
                log.exception("preempt failed; answering with no eviction")
                PREEMPT_NODES.labels("error").inc()
                body = _answer({})
            return web.Response(body=orjson.dumps(body), content_type="application/json")
