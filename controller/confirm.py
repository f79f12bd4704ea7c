"""The extender's confirmations: an answered bind's booking marked bound in Redis after the answer.

Once the Binding exists the bind has succeeded and answers; its booking is still a reservation under its TTL
until marked bound. The binds answered on one node within CONFIRM_LINGER are marked bound together (one
`mark_bound` call and one feed message for the batch, not one per pod: every role's mirror reads each message).
A booking found gone meanwhile is booked again from the pod's record while the pod is still there (`_rebook`); a
confirmation that fails is left to the pod watcher, which books the pod from its record (BOUND_GRACE)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

from shared.domain.annotations import PodUsage
from shared.domain.quota import is_terminal
from shared.domain.request import SliceRequest
from shared.serving.metrics import OVERCOMMIT, REBOOKED, SETTLE_FAILURES
from shared.store.ledger import MARK_BOUND_MAX, Ledger

log = logging.getLogger("mtsched.extender")

# How long an answered bind waits for others on its node before their bookings are marked bound in one call
# (_confirm): well inside the pod watcher's BOUND_GRACE, after which it would confirm the record itself
CONFIRM_LINGER = 0.05
# (node, uid) -> the pod bound to that node as that uid, None when it is not; raises when the API server does not say
PodHere = Callable[[str, str, str, str], Awaitable[Mapping[str, Any] | None]]


class Confirmations:
    def __init__(self, ledger: Ledger, pod_here: PodHere) -> None:
        self.ledger = ledger
        self.pod_here = pod_here
        self._settling: set[asyncio.Task[None]] = set()  # answered binds' confirmations (settle)
        # node -> uid -> (pod, request, cards, capacity) of answered binds waiting for their batch (_confirm)
        self._confirming: dict[str, dict[str, tuple[str, SliceRequest, tuple[int, ...], int]]] = {}
        self._sending = 0  # bookings in mark_bound calls under way (_confirm)
        self._rebooking = 0  # bookings found gone, being booked again (_rebook)

    def settle(self, node: str, uid: str, pod: str, req: SliceRequest, cards: tuple[int, ...],
                capacity: int) -> None:
        """The Binding exists, so bind answers now; the booking is marked bound after (_confirm), off every
        bind's latency and off kube-scheduler's connections, together with the node's other binds answered
        within CONFIRM_LINGER: one round trip and one feed message for the batch, not one per pod (every
        role's mirror reads each message). Until then it is a reservation under its TTL, as it was between
        reserve and the Binding, and the pod watcher marks it bound too once it sees the record (it waits
        BOUND_GRACE for this confirmation first). `settled` waits for these (shutdown, tests)."""
        batch = self._confirming.get(node)
        if batch is None:
            batch = self._confirming[node] = {}
            self._track(self._confirm(node))
        batch[uid] = (pod, req, cards, capacity)

    def _track(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._settling.add(task)
        task.add_done_callback(self._settled_one)

    def unconfirmed(self) -> int:
        """Answered binds whose booking is not marked bound yet: queued, in a call, or being booked again."""
        return sum(len(b) for b in self._confirming.values()) + self._sending + self._rebooking

    async def _confirm(self, node: str) -> None:
        """Mark the node's answered binds bound, after CONFIRM_LINGER; a bind answered meanwhile joins them.
        A booking found gone is handled alone (_rebook)."""
        try:
            await asyncio.sleep(CONFIRM_LINGER)
        except asyncio.CancelledError:  # stopped first: a bind answered from here on starts a batch of its own
            # (left to the pod watcher's observe; counted by `settled`, which a stop runs before cancelling)
            self._confirming.pop(node, None)
            raise
        batch = self._confirming.pop(node, {})  # a bind answered from here on starts the next batch
        uids = list(batch)
        left = len(uids)
        self._sending += left
        try:
            for start in range(0, len(uids), MARK_BOUND_MAX):
                chunk = uids[start:start + MARK_BOUND_MAX]
                try:
                    missing = await self.ledger.mark_bound_many(node, chunk)
                except Exception as e:
                    # the pods are bound with their records: the pod watcher books them from those (observe)
                    SETTLE_FAILURES.inc(len(chunk))
                    log.warning("bind: marking %d booking(s) on %s bound failed (the pod watcher books them "
                                "from their records): %s", len(chunk), node, e)
                    continue
                finally:
                    self._sending -= len(chunk)
                    left -= len(chunk)
                for uid in missing:
                    self._rebooking += 1
                    self._track(self._rebook_one(node, uid, *batch[uid]))
        finally:
            self._sending -= left  # chunks a cancellation kept from being sent

    async def _rebook_one(self, node: str, uid: str, pod: str, req: SliceRequest, cards: tuple[int, ...],
                          capacity: int) -> None:
        try:
            await self._rebook(node, uid, pod, req, cards, capacity)
        finally:
            self._rebooking -= 1

    def _settled_one(self, task: asyncio.Task[None]) -> None:
        self._settling.discard(task)
        if not task.cancelled() and (e := task.exception()) is not None:
            # the pod is bound with its record: the pod watcher books it from that (observe)
            SETTLE_FAILURES.inc()
            log.warning("bind: confirming a booking failed (the pod watcher books it from its record): %s", e)

    async def settled(self, timeout: float = 10.0) -> None:
        """Wait (at most `timeout` s) until the bookings of answered binds are marked bound, those of binds
        answered meanwhile included; says how many were left."""
        deadline = asyncio.get_running_loop().time() + timeout
        while self._settling:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                unconfirmed = self.unconfirmed()  # bookings, not tasks: one confirmation carries a batch
                SETTLE_FAILURES.inc(unconfirmed)
                log.warning("bind: %d booking(s) not marked bound by the stop (the pod watcher books them from "
                            "their records)", unconfirmed)
                return
            await asyncio.wait(set(self._settling), timeout=left)

    async def _still_here(self, pod: str, uid: str, node: str) -> bool:
        """Whether the pod still exists, bound to `node`, and has not ended (Succeeded or Failed). A booking found
        gone after its Binding may have been released because the pod ended: booked again it would hold cards
        for nobody (a pod that ended within the confirmation's linger was booked again for ever: a CI run).
        Not knowing (the API server unreachable) counts as here: holding a share too long is repaired, giving
        it away is not."""
        ns, _, name = pod.partition("/")
        try:
            got = await self.pod_here(ns, name, uid, node)
        except Exception:  # unreachable, or an answer we cannot read: fail closed
            return True
        return got is not None and not is_terminal(got)

    async def _rebook(self, node: str, uid: str, pod: str, req: SliceRequest, cards: tuple[int, ...],
                      capacity: int) -> None:
        """The Binding exists but its booking was not there to mark bound. If it went while the bind was in
        flight (expired past the TTL, or released by a repair) and the pod is still there, it holds its cards
        anyway: book what its record says now, as the watcher will once it sees the record (over-commit is
        booked and reported, never hidden)."""
        if not await self._still_here(pod, uid, node):
            # deleted (and released by the pod watcher) between the Binding and this confirmation
            log.info("bind: %s (%s) ended before its booking on %s was confirmed: not booked again", pod, uid,
                     node)
            return
        mem, cores, slices = req.booking_for(capacity)
        out = await self.ledger.observe(uid, PodUsage(node, cards, mem, cores, slices), pod, keep_bound=True)
        if not out.get("ok"):
            # the node went with it (observe never creates one): the pod watcher, seeing the record, asks
            # for a rebuild, which books it on placeholder cards
            log.error("bind: the booking of %s (%s) on %s went while its bind was in flight, and so did the "
                      "node from the ledger (%s): nothing is booked until the watchers see its record", pod, uid,
                      node, out.get("reason"))
            return
        if out.get("ended"):
            # deleted after _still_here read it, and the pod watcher's release (its tombstone) came first: nothing
            # is booked (observe.lua `ended`, shared/domain/ended.py)
            log.info("bind: %s (%s) ended before its booking on %s was confirmed: not booked again", pod, uid, node)
            return
        REBOOKED.inc()
        if out.get("overcommit"):
            # the watcher, seeing the record later, finds this booking as it is and reports nothing
            OVERCOMMIT.inc()
        log.error("bind: the booking of %s (%s) on %s went while its bind was in flight; booked again from its "
                  "record: %s", pod, uid, node, out)
