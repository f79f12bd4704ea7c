"""What one extender replica has in flight between its filters and binds, and who it owes a wake.

`held`: node -> the bookings being made here and the cards filter claimed for the pod it sent to its one returned
node (kube-scheduler schedules the next pod before that bind arrives), counted by filter and prioritize until the
mirror has them. The pods nominated to a node by a preemption (controller/nominations.py) are placed ahead of the
pods they outrank (`_held_for`). kube-scheduler tries a pod the filter turned away again only on a cluster event:
when what turned it away ends unused (a claim lapses, a nomination leaves its node, the ledger is kept again after
no watcher kept it) the watchers are asked on the feed to nudge kube-scheduler (`_wake`, Ledger.notify)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from controller.fit_memo import Held, Planned, held_states
from controller.nominations import FOLLOW_AT_S, FOLLOW_EVERY_S, Nominations, followed, read_times
from shared.config import Config
from shared.domain.preempt import Holding, plan_ahead
from shared.domain.request import SliceRequest
from shared.domain.timing import BIND_READ_S
from shared.kube import Kube, KubeError
from shared.serving.metrics import WAKES
from shared.store.ledger import Ledger
from shared.store.mirror import Mirror

log = logging.getLogger("mtsched.extender")

CLAIM_TICK_SECONDS = 1.0  # how often claims lapse while no filter comes (expire_claims)
CLAIM_SECONDS = 5.0  # how long filter's claim on its one returned node lasts without a bind (Extender._claim)
MAX_FOLLOWED = 64  # nominated pods read on the API server at once in their first reads, and after them (follow)
# of their reads, at most this many in flight at once: the API client's connections (64) are left to the binds, which
# get BIND_CONNECT_S to get one (as Events: shared/kube.py BEST_EFFORT_IN_FLIGHT); the others wait their turn
MAX_FOLLOW_READS = 8


class InFlight:
    def __init__(self, cfg: Config, ledger: Ledger, mirror: Mirror, kube: Kube | None):
        self.cfg = cfg
        self.ledger = ledger
        self.mirror = mirror
        self.kube = kube
        # node -> uid -> (request, cards) of bookings in flight here (sent, not yet in the mirror): filter and
        # prioritize count them, so pods filtered meanwhile are not sent to a card that is being taken
        self.held: dict[str, dict[str, tuple[SliceRequest, tuple[int, ...]]]] = {}
        self._claims: dict[str, tuple[str, float]] = {}  # uid -> (node, until) of filter's claims (Extender._claim)
        # pods nominated to a node by a preemption, not bound yet: pods of lower or equal priority leave them
        # the cards they fit there (_held_for), as kube-scheduler's own filters leave them the node's totals
        self.nominations = Nominations()
        # node -> (key, plan, the nominations it places) of the last plan made there with nothing else in flight
        self._planned: dict[str, tuple[tuple[Any, ...], Planned, tuple[Any, ...]]] = {}
        # nodes where a filter placed a pod nowhere while bookings or claims were in flight here: when such a
        # claim ends without its bind, the pod turned away is woken (_unclaim)
        self._turned_away: set[str] = set()
        self._notices: set[asyncio.Task[None]] = set()  # notices being sent (_notify)
        self._following: dict[str, asyncio.Task[None]] = {}  # uid -> its reads while nominated (follow)
        self._followed_long: set[str] = set()  # those past their first reads (FOLLOW_AT_S)
        self._follow_reads = asyncio.Semaphore(MAX_FOLLOW_READS)  # their reads' turns
        self._verify_asked: dict[str, float] = {}  # node -> when its last verify notice went (_notify)
        # a node per slice pod turned away while no watcher kept the ledger (its first candidate): kube-scheduler
        # tries such a pod again only on a cluster event, so these are woken once the ledger is kept again
        # (kept_again)
        self._unkept_wake: set[str] = set()

    def nominate(self, uid: str, priority: int, req: SliceRequest, annotations: Mapping[str, str],
                 nodes: Mapping[str, tuple[str, ...]] | Iterable[str]) -> None:
        """The pod is nominated to one of `nodes` (controller/nominations.py); the nodes it left wake the pods
        turned away there for it."""
        self._woken(self.nominations.record(uid, priority, req, annotations, nodes))

    def follow(self, ns: str, name: str, uid: str, answered: Collection[str] | None = None) -> None:
        """Read a nominated pod on the API server while its nomination lives (_follow). After the preempt verb's
        answer (`answered`: the nodes it named): kube-scheduler nominates the pod to one of them, and its next
        filter, which says which, may come only once its victims are gone (their grace period, 30 s by default),
        while every other node answered would hold a card for it. After either: a preemptor deleted, or bound by
        another replica, would hold its card until NOMINATION_SECONDS passed without a filter of it, where
        kube-scheduler's own filters stop counting it at once.

        An answer starts the pod's reads afresh (kube-scheduler writes its choice after the answer: a follower of an
        earlier nomination would read the old one). Bounded: MAX_FOLLOWED pods in their first reads (FOLLOW_AT_S)
        and MAX_FOLLOWED after them, apart, so pods nominated for long never keep a new answer from being narrowed;
        beyond, a nomination ends at NOMINATION_SECONDS as if not followed."""
        if self.kube is None:
            return
        running = self._following.get(uid)
        if running is not None and not running.done() and answered is None:
            return  # followed already
        # the pods in their first reads, this one's earlier follower aside (a new one would take its place)
        first = len(self._following) - len(self._followed_long)
        if running is not None and uid not in self._followed_long:
            first -= 1
        if running is not None:
            running.cancel()  # its done-callback finds another in its place, or none: the accounting is done here
            del self._following[uid]
            self._followed_long.discard(uid)
        if first >= MAX_FOLLOWED:  # no room: an earlier follower ended too, it would read kube-scheduler's old choice
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # called outside the event loop (a synchronous test): nothing to follow with
            return
        task = loop.create_task(self._follow(ns, name, uid, frozenset(answered) if answered is not None else None))
        self._following[uid] = task

        def done(t: asyncio.Task[None]) -> None:
            if self._following.get(uid) is t:
                del self._following[uid]
                self._followed_long.discard(uid)
        task.add_done_callback(done)

    async def _follow(self, ns: str, name: str, uid: str, answered: frozenset[str] | None) -> None:
        """Reads at FOLLOW_AT_S after the start, then every FOLLOW_EVERY_S, until the nomination is forgotten
        (`followed` says what each read means); a read that fails changes nothing (the nomination then lapses on
        its own)."""
        assert self.kube is not None
        loop = asyncio.get_running_loop()
        start = loop.time()
        for i, at in enumerate(read_times(FOLLOW_AT_S, FOLLOW_EVERY_S)):
            if i == len(FOLLOW_AT_S):  # past its first reads: one of the pods followed for long, if there is room
                if len(self._followed_long) >= MAX_FOLLOWED:
                    return
                self._followed_long.add(uid)
            await asyncio.sleep(max(0.0, start + at - loop.time()))
            async with self._follow_reads:  # its turn (MAX_FOLLOW_READS)
                got = self.nominations.by_uid.get(uid)
                if got is None:
                    return  # forgotten: bound, filtered with no nomination, lapsed
                pod: Mapping[str, Any] | None
                try:
                    async with asyncio.timeout(BIND_READ_S):
                        pod = await self.kube.get_pod(ns, name)
                except KubeError as e:
                    if e.status != 404:
                        continue
                    pod = None
                except Exception:  # unreachable, a timeout, an answer we cannot read: as it was
                    continue
            if self.nominations.by_uid.get(uid) is not got:
                continue  # recorded again during the read (a filter, another answer): that is newer
            what, node = followed(pod, uid, settled=i >= len(FOLLOW_AT_S) - 1, answered=answered)
            if what == "forget":
                self._woken(self.nominations.forget(uid))
                log.info("nomination of %s/%s forgotten: %s", ns, name,
                         "gone" if pod is None else "bound, being deleted, or nominated nowhere")
                return
            if what == "nominate":
                self.nominate(uid, got.priority, got.request, got.annotations, [node])

    def _woken(self, nodes: set[str]) -> None:
        """Nodes a nomination left without its pod: a pod turned away there meanwhile is tried again."""
        for node in nodes & self._turned_away:
            self._turned_away.discard(node)
            self._wake(node)

    def _held_for(self, uid: str, priority: int, only: str | None = None) -> Held:
        """`held` as the pod `uid` of `priority` sees it: with the pods nominated to a node ahead of it placed there
        (shared/domain/preempt.py plan_ahead), as kube-scheduler counts them for it. `self.held` when none is.
        `only`: that node alone (bind). A node's plan with nothing else in flight there is kept for its snapshot
        and the nominations it places (Planned), with the fits made on it: a filter plans only what changed."""
        if not self.nominations:
            return self.held
        merged: dict[str, Mapping[str, tuple[SliceRequest, tuple[int, ...]]]] = dict(self.held)
        get = self.mirror.get
        for node in self.nominations.by_node if only is None else [only]:
            snap = get(node)
            if snap is None or snap.error:
                continue
            booked, inflight = snap.reservations, self.held.get(node, {})
            # one booked there, or being booked or claimed there (in flight), holds its cards already
            ahead = self.nominations.ahead_of(node, uid, priority, booked.keys() | inflight.keys())
            if not ahead:
                continue
            here = {u: b for u, b in self.held.get(node, {}).items() if u != uid}
            key = (snap.seq, tuple((n.uid, id(n)) for n in ahead))
            cached = self._planned.get(node) if not here else None
            if cached is not None and cached[0] == key:
                merged[node] = cached[1]
                continue
            first = [n.at(node) for n in ahead]
            holdings = {v: Holding(r.cards, r.mem, r.cores, r.slices) for a in first for v in a.victims
                        if (r := booked.get(v)) is not None}
            _, planned = plan_ahead(held_states(snap, here), holdings, first, self.cfg.gpu_scheduler_policy)
            if not planned:
                continue
            requests = {a.uid: a.request for a in first}
            plan = {**here, **{u: (requests[u], cards) for u, cards in planned.items()}}
            if here:
                merged[node] = plan
                continue
            merged[node] = got = Planned(snap.seq, plan)
            if len(self._planned) > 2 * len(self.nominations.by_node) + 64:  # bounded: nodes nominated now
                self._planned = {n: e for n, e in self._planned.items() if n in self.nominations.by_node}
            # the nominations placed are kept with it: the ids in the key stay theirs while it lives
            self._planned[node] = (key, got, tuple(ahead))
        return merged

    def _prune_claims(self) -> None:
        """Drop claims that lapsed or whose booking the mirror now holds (few: pods between filter and bind)."""
        now = time.monotonic()
        for uid, (node, until) in list(self._claims.items()):
            snap = self.mirror.get(node)
            booked = snap is not None and uid in snap.reservations
            if booked or until < now:
                self._unclaim(uid, lapsed=not booked)

    async def expire_claims(self) -> None:
        """Lapse claims while no filter comes (which prunes them too): a pod turned away for a claim whose bind
        never came (it went to another replica and was refused, the pod was deleted or filtered again
        elsewhere) is woken within CLAIM_SECONDS + CLAIM_TICK_SECONDS, not at kube-scheduler's next event."""
        while True:
            await asyncio.sleep(CLAIM_TICK_SECONDS)
            if self.nominations:
                self._woken(self.nominations.lapse())
            if self._claims:
                try:
                    self._prune_claims()
                except Exception:  # one bad tick must not end the role: the next filter prunes as well
                    log.exception("pruning the filter's claims failed")

    def _unclaim(self, uid: str, lapsed: bool = False) -> None:
        """Drop a claim: its bind took it over (`lapsed` False), or it ended unused (True). kube-scheduler
        retries the pods a filter turned away only on a cluster event (a bind refused is one, a claim
        lapsing is none): when this claim's node turned pods away, the watchers are asked to nudge it."""
        got = self._claims.pop(uid, None)
        if got is None:
            return
        node = got[0]
        held = self.held.get(node)
        if held is not None:
            held.pop(uid, None)
            if not held:
                del self.held[node]
        if lapsed:
            self._woken({node})
        elif node not in self.held:
            self._turned_away.discard(node)  # nothing held there any more: nobody was turned away for it

    def kept_again(self) -> None:
        """A watcher keeps the ledger current again (controller/upkeep.py): the pods turned away meanwhile are
        tried again, through a nudge of a node each of them could go to."""
        for node in sorted(self._unkept_wake):
            self._wake(node)
        self._unkept_wake.clear()

    def _wake(self, node: str) -> None:
        WAKES.inc()
        self._notify("wake", node)

    def _notify(self, kind: str, node: str) -> None:
        """A notice to the watchers (Ledger.notify). `verify` at most once per node a second: every bind
        refused there asks for the same comparison (a wake is sent once per claim that turned pods away)."""
        if kind == "verify":
            now = time.monotonic()
            if now - self._verify_asked.get(node, -1.0) < 1.0:
                return
            if len(self._verify_asked) >= 4096:  # bounded: forget the old ones (a notice more is harmless)
                self._verify_asked = {n: t for n, t in self._verify_asked.items() if now - t < 1.0}
            self._verify_asked[node] = now

        async def send() -> None:
            try:
                await self.ledger.notify(kind, node)
            except Exception as e:  # Redis away: the watchers' next pass or kube-scheduler's next event
                log.warning("could not send the watchers a %s notice about %s: %s", kind, node, e)

        task = asyncio.create_task(send())
        self._notices.add(task)
        task.add_done_callback(self._notices.discard)
