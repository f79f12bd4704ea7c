"""The extender's preempt verb: kube-scheduler's victims on a node, kept whole if they free a card, else none.

kube-scheduler calls it after its own dry run (which counts node totals only), with the victims it would
evict per candidate node; what we answer is what it evicts (an empty answer: nothing). Per node the pure
rule (shared/domain/preempt.py) reads the mirror's card states and reservations (which pod holds which
card): the proposal stands when, with its card holders gone, the preemptor fits the cards; else the node is
dropped. Never a part of it: each of kube-scheduler's victims is needed for its own filters.
Fail closed: a node the mirror does not know, or a state not loaded yet or kept by no watcher (the filter's
`unkept`), gets no eviction.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from controller.fit_memo import MOVING, held_states
from shared.domain.admission import placement_request
from shared.domain.extender_args import ArgsError
from shared.domain.fit import FIT_ANNOTATIONS
from shared.domain.preempt import KEPT, Choice, Holding, choose_victims
from shared.domain.preempt_args import NodeVictims, PreemptionArgs, parse_preemption_args
from shared.domain.request import RequestError, SliceRequest
from shared.domain.shapes import listed
from shared.domain.state import NodeSnapshot
from shared.serving.http import BodyError, read_body
from shared.serving.metrics import EXTENDER_SECONDS, PREEMPT_NODES

if TYPE_CHECKING:
    from controller.extender import Extender

log = logging.getLogger("mtsched.preempt")

UNKNOWN_NODE = "unknown_node"
EVENT_LISTED = (4, "; ", 180)  # nodes an event names, and characters of each: 4 x 200 and its words fit 1024


def _answer(nodes: Mapping[str, tuple[tuple[str, ...], int]]) -> dict[str, Any]:
    """ExtenderPreemptionResult: always the meta form (kube-scheduler maps UIDs back to its pods)."""
    return {"NodeNameToMetaVictims": {n: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": pdb}
                                      for n, (uids, pdb) in nodes.items()}}


class Preemption:
    def __init__(self, ext: Extender):
        self.ext = ext

    def _node(self, a: PreemptionArgs, req: SliceRequest, node: str, victims: NodeVictims,
              snap: NodeSnapshot | None) -> Choice:
        if snap is None or snap.error:
            return Choice(UNKNOWN_NODE, reason="node unknown to the card ledger" if snap is None else snap.error)
        if node in self.ext.mirror.moving:  # as the filter: Redis books nothing there until the move ends
            return Choice(UNKNOWN_NODE, reason=MOVING)
        holdings = {uid: Holding(r.cards, r.mem, r.cores, r.slices) for uid, r in snap.reservations.items()}
        annotations = a.pod["metadata"].get("annotations") or {}
        proposed = [v.uid for v in victims.pods]
        # as the filter: bookings in flight here count (binds under way, a filter's claim of the node), but
        # the preemptor's own and its victims' (they are evicted, their binds end)
        uid = a.pod["metadata"]["uid"]
        others = {u: b for u, b in self.ext.held.get(node, {}).items() if u != uid and u not in proposed}
        states = held_states(snap, others) if others else snap.states()
        # pods nominated here by earlier preemptions, of a priority at least this one's: kube-scheduler's dry
        # run counted them on the node, so the victims must leave this pod a card besides theirs
        # (one booked there, or with a booking or claim in flight there, holds its cards already)
        ahead = [n.at(node) for n in self.ext.nominations.ahead_of(
            node, uid, a.priority, snap.reservations.keys() | self.ext.held.get(node, {}).keys())]
        return choose_victims(states, holdings, proposed, req, annotations, self.ext.cfg.gpu_scheduler_policy,
                              ahead)

    async def preempt(self, doc: object) -> dict[str, Any]:
        """ExtenderPreemptionResult for ExtenderPreemptionArgs; ArgsError (HTTP 400) when malformed."""
        a = parse_preemption_args(doc)
        meta = a.pod["metadata"]
        ref = f"{meta['namespace']}/{meta['name']}"
        event_pod = {"metadata": {k: meta[k] for k in ("name", "namespace", "uid")}}
        try:
            req = placement_request(a.pod, self.ext.cfg)
        except RequestError as e:  # the filter placed it nowhere; nothing is evicted for it either
            PREEMPT_NODES.labels("bad_request").inc(len(a.nodes))
            log.info("preempt for %s: no eviction, its request is invalid: %s", ref, listed(e.problems))
            return _answer({})
        if req is None:  # asks no card: the cards have no say, kube-scheduler's choice stands
            PREEMPT_NODES.labels("no_request").inc(len(a.nodes))
            return _answer({n: (tuple(v.uid for v in nv.pods), nv.pdb_violations) for n, nv in a.nodes.items()})
        if not self.ext.mirror.ready.is_set():
            PREEMPT_NODES.labels("not_ready").inc(len(a.nodes))
            log.warning("preempt for %s: card state not loaded yet, no eviction", ref)
            return _answer({})
        unkept = self.ext.unkept()
        if unkept:  # as the filter: nothing is judged on a ledger no watcher keeps (controller/upkeep.py)
            PREEMPT_NODES.labels("unkept").inc(len(a.nodes))
            log.warning("preempt for %s: no eviction: %s", ref, unkept)
            self.ext.event(event_pod, "PreemptionNotHelpful", f"no eviction: {unkept}", "Warning")
            return _answer({})
        out: dict[str, tuple[tuple[str, ...], int]] = {}
        refused: list[str] = []
        chosen: list[str] = []
        for node, victims in a.nodes.items():
            choice = self._node(a, req, node, victims, self.ext.mirror.get(node))
            PREEMPT_NODES.labels(choice.outcome).inc()
            if not choice.victims:
                refused.append(f"{node}: {choice.reason}")
                continue
            out[node] = (choice.victims, victims.pdb_violations)  # its proposal: kube-scheduler's own count
            why = (f"cards {','.join(map(str, choice.cards))} freed" if choice.outcome == KEPT
                   else "its cards fit already, the victims free what kube-scheduler counts")  # UNCHANGED
            chosen.append(f"{node}: {why}, {len(choice.victims)} victims")
        if out:  # kube-scheduler nominates it to one of them: pods after it leave it the room (_held_for)
            fits = {k: v for k in FIT_ANNOTATIONS if isinstance(v := (meta.get("annotations") or {}).get(k), str)}
            self.ext.nominate(meta["uid"], a.priority, req, fits, {n: v for n, (v, _) in out.items()})
            # kube-scheduler picks one: read which, soon (not at its next filter only), and while it waits
            self.ext.follow(meta["namespace"], meta["name"], meta["uid"], answered=out.keys())
        # the first few of each, and how many more: a call names up to 10,000 nodes, a reason is up to a node's
        # error or one per card (listed whole, one line per call was 600 KB at 300 nodes in error: red team); an
        # event fewer and shorter, so that "and N more" fits its 1024 characters (Extender.event cuts the rest)
        log.info("preempt for %s: %d of %d nodes kept (%s); dropped: %s", ref, len(out), len(a.nodes),
                 listed(chosen) or "none", listed(refused) or "none")
        if out:
            self.ext.event(event_pod, "PreemptionCardChosen", "nodes where kube-scheduler's victims leave the "
                           "preemptor a card (it evicts on one of them): " + listed(chosen, *EVENT_LISTED))
        else:  # a node's reason says which: no card freed, or a node the ledger cannot book on now
            self.ext.event(event_pod, "PreemptionNotHelpful", "no eviction: on no candidate node would the "
                           "proposed victims leave a card the preemptor fits on: " + listed(refused, *EVENT_LISTED),
                           "Warning")
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
