"""The janitor: reclaims pending reservations whose binder died or gave up, after pendingTTLSeconds."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Coroutine, Mapping
from typing import Any

from controller.nudger import Nudger
from shared.config import Config
from shared.domain.reconcile import booking_key, expires, pending_since, restamps
from shared.domain.state import Reservation
from shared.domain.timing import JANITOR_INTERVAL_S, janitor_rest_s
from shared.serving.metrics import JANITOR_HELD, RELEASES
from shared.store.ledger import RESEND, Ledger, slot_moving
from shared.store.mirror import Mirror

log = logging.getLogger("mtsched.watchers")


class Janitor:
    """Reclaims pending reservations whose binder died or gave up, after the TTL."""

    def __init__(self, ledger: Ledger, mirror: Mirror, cfg: Config, interval: float = JANITOR_INTERVAL_S,
                 nudger: Nudger | None = None,
                 before_expire: Callable[[list[str]], Awaitable[Collection[str]]] | None = None,
                 redis_time: Callable[[int], None] | None = None,
                 view_problem: Callable[[], str] | None = None,
                 api_holds: Callable[[str, Mapping[str, str]], Awaitable[Collection[str]]] | None = None):
        self.nudger = nudger
        self.ledger = ledger
        self.mirror = mirror
        self.ttl = cfg.pending_ttl_seconds
        self.interval = interval
        # called with the uids of pending bookings past the TTL before they are expired: the pod watcher
        # confirms those whose record it holds back (PodWatcher.confirm_now), so a record seen late is booked;
        # it returns those it could not (held back, in flight, failed): they are not expired
        self.before_expire = before_expire
        self.redis_time = redis_time  # told Redis's clock each sweep (PodWatcher.saw_redis_time)
        # why the pod view cannot vouch for a pending booking now ("" when it can): a booking stays pending
        # after its Binding when the binder died, its confirmation failed or the Binding's outcome was
        # unknown, and only the pod watcher's sight of the record saves it. While that view is blind (the
        # stream down, or just back and replaying), expiring it could free a running pod's cards.
        self.view_problem = view_problem or (lambda: "")
        # called, after before_expire, with a node and the uids still to expire there (uid -> its pod's
        # namespace/name): those whose pod the API server holds bound there, or cannot say of, are not expired
        # (PodWatcher.api_holds). It is called for every such node of a sweep at once, once every node was looked at
        # (the watcher's reads take turns: API_HOLDS_READS at a time, shared/domain/timing.py), and each node's
        # expiry is sent as soon as its answer comes. A live view may still be behind (nothing measures how far): a
        # Binding committed within the TTL's first half may not be in it when the TTL ends, and the view's silence
        # proves nothing
        self.api_holds = api_holds
        self._held = ""  # the problem that holds expiry back, logged once per episode
        # pending booking (booking_key) -> first seen, monotonic (pending_since)
        self._since: dict[tuple[str, str, int, int], float] | None = None
        self.on_progress: Callable[[], None] = lambda: None  # after each sweep that completed (Supervisor.progress)
        self.swept_at = float("-inf")  # the monotonic clock a sweep dates and ages bookings by (`run` spaces them)

    async def sweep(self) -> list[str]:
        # The sweep's start on our clock, before its first round trip: the bound (timing.pending_release_bound_s) ends
        # the TTL on a sweep's start; read after it, a slow round trip at a booking's sighting dated it late, and
        # the sweep starting a TTL later left it to the next, an interval past the bound (red team); `run` spaces the
        # sweeps by it
        clock = self.swept_at = time.monotonic()
        # Reservations are stamped with Redis's clock, so age is measured on it: this host's may be off.
        now = await self.ledger.redis_time_ms()
        if self.redis_time is not None:
            self.redis_time(now)
        gone: list[str] = []
        ages = {booking_key(node, r): now - r.created for node, snap in self.mirror.nodes.items()
                for r in snap.reservations.values() if r.state == "pending"}
        since = pending_since(ages, self._since or {}, clock, first=self._since is None)
        # and the dates of stamps only a fresh read showed (below), while their booking is pending in the mirror
        live = {k[:2] for k in ages}
        since.update((k, at) for k, at in (self._since or {}).items() if k not in since and k[:2] in live)
        if self.mirror.nodes:  # (a mirror not read yet, at the start, dates nothing: its whole read comes at once)
            self._since = since
        asking: list[Coroutine[Any, Any, list[str]]] = []  # the nodes whose pods the API server is asked about
        errors: list[Exception] = []
        try:
            for node, snap in list(self.mirror.nodes.items()):
                try:  # (its own errors: the other nodes are still looked at, and the first is raised at the end)
                    if node in self.mirror.moving:  # Redis runs no script there until its slot's move ends: next sweep
                        continue
                    # past the TTL on Redis's clock and on ours (pending_since); and those stamped ahead of Redis's
                    # clock, which expire.lua stamps anew (restamps)
                    due = [r.uid for r in snap.reservations.values()
                           if expires(r, now, self.ttl * 1000) and clock - since[booking_key(node, r)] >= self.ttl]
                    held: dict[str, Reservation] = {}
                    if due:
                        # A later bind attempt that takes over the booking (reserve's `existing`) stamps a new
                        # settle_by and sends no feed message: the mirror's copy still bears the first attempt's, dated
                        # long ago. Asked of Redis itself, a stamp not dated yet is dated now (a step of Redis's clock
                        # forward would otherwise free the card that attempt's Binding is about to take)
                        try:
                            fresh = await self.ledger.snapshot(node, give_up=slot_moving)
                        except RESEND as e:  # (as Ledger._retry raised it)
                            if not slot_moving(e):
                                raise
                            continue  # its slot is moving: the other nodes are swept
                        held = dict(fresh.reservations) if fresh is not None else {}
                        for uid in due:
                            if uid in held:
                                since.setdefault(booking_key(node, held[uid]), clock)
                        due = [u for u in due
                               if u in held and clock - since[booking_key(node, held[u])] >= self.ttl]
                    old = due + [r.uid for r in snap.reservations.values() if restamps(r, now) and r.uid not in due]
                    if old:
                        if self.before_expire is not None:
                            keep = await self.before_expire(old)
                            old = [u for u in old if u not in keep]
                        if old and self.api_holds is not None:
                            if self._blind(len(old)):  # nothing is expired while blind: no read of the API server
                                continue
                            refs = {u: (held.get(u) or snap.reservations[u]).pod for u in old}
                            # its pods are read together with the other nodes' (below): a sweep's reads take about
                            # ceil(reads / API_HOLDS_READS) reads' time, not one per node after the other
                            asking.append(self._vet_and_expire(node, old, refs, {u: held[u] for u in old if u in held}))
                            continue
                        gone.extend(await self._expire(node, old))
                except Exception as e:  # raised at once, one node's (its Redis Cluster shard out of reach) stopped
                    errors.append(e)  # every node's expiry, sweep after sweep (red team): raised once all are done
        except BaseException:
            for ask in asking:  # (none begun: the nodes' reads start below)
                ask.close()
            raise
        for expired in await _together(asking):
            gone.extend(expired)
        if errors:
            raise errors[0]
        if gone:
            log.info("expired %d pending reservation(s) older than %ss", len(gone), self.ttl)
        self._blind(0)  # a sweep with nothing to expire still ends an episode (or starts one: the gauge)
        return gone

    async def _vet_and_expire(self, node: str, old: list[str], refs: Mapping[str, str],
                              judged: Mapping[str, Reservation]) -> list[str]:
        """`old` on `node` expired, but for those whose pod the API server holds bound there or cannot say of
        (api_holds; its reads share their turns with the other nodes' of the sweep), and those of `judged` (past the
        TTL as Redis held them when the node was looked at) stamped anew since."""
        if self._blind(len(old)):  # blind since the node was looked at (its reads wait for the other nodes'): none
            return []
        keep = await self.api_holds(node, refs) if self.api_holds is not None else ()
        left = [u for u in old if u not in keep]
        if any(u in judged for u in left):
            # The node's expiry waits on its slowest read, which waits its turn behind the other nodes': a later bind
            # attempt may have taken a booking over after its pod was read (reserve's `existing`: a new settle_by, no
            # feed message) and had its Binding committed, its settle_by passed by now: expire.lua would free a bound
            # pod's cards on that read (red team, tests/redis/test_redteam_janitor_overlap.py). Read again
            # here, one stamped anew since it was judged is left to the next sweep; one taken over after this read
            # is still in flight when expire.lua runs (its settle_by ahead), which keeps it.
            try:
                fresh = await self.ledger.snapshot(node, give_up=slot_moving)
            except RESEND as e:  # (as Ledger._retry raised it)
                if not slot_moving(e):
                    raise
                return []  # its slot is moving: the next sweep
            now = fresh.reservations if fresh is not None else {}
            left = [u for u in left if u not in judged
                    or (u in now and booking_key(node, now[u]) == booking_key(node, judged[u]))]
        return await self._expire(node, left)  # no await from here to expire's send

    async def _expire(self, node: str, old: list[str]) -> list[str]:
        """The vetted uids `old` on `node` expired, in one expire.lua on that node; what it expired."""
        if self._blind(len(old)):  # judged after the last await, as before_expire's and api_holds' answers
            return []
        # only the uids vetted here: expire.lua judges at its own `now`, and a booking that crossed the
        # TTL since ours (or one the mirror lags on) was never offered to before_expire
        try:
            expired = await self.ledger.expire(node, self.ttl, only=old)
        except RESEND as e:  # (as Ledger._retry raised it)
            if not slot_moving(e):
                raise
            return []  # its slot is moving (the ledger told the mirror): the other nodes are swept
        RELEASES.labels("expired").inc(len(expired))
        if expired and self.nudger:
            self.nudger.nudge(node)
        return expired

    def _blind(self, due: int) -> bool:
        """True while the pod view is blind: nothing is expired. The gauge and one log line per episode."""
        why = self.view_problem()
        JANITOR_HELD.set(1 if why else 0)
        if why and not self._held:
            log.warning("janitor: expiring no pending reservation while the pod view is blind (%s)%s", why,
                        f": {due} past pendingTTLSeconds kept" if due else "")
        elif self._held and not why:
            log.info("janitor: the pod view is live again: expiring pending reservations past the TTL")
        self._held = why
        return bool(why)

    async def run(self) -> None:
        while True:  # errors go to the supervisor, which restarts the loop with backoff
            await self.sweep()
            self.on_progress()
            # sweeps' clocks (`swept_at`, read at each sweep's start) `interval` apart at least (a longer sweep is
            # followed at once by the next): the time a sweep's reads take does not push every later sweep back, and a
            # booking's expiry is bounded by its TTL, the interval and one sweep (shared/domain/timing.py
            # pending_release_bound_s). Spaced by the very clocks the TTL is judged between: with a TTL a multiple of
            # the interval (120 and 5 s), clocks a hair under the interval apart (read after a round trip that varies)
            # left a booking a sweep past the bound about half the time (tests/unit/test_janitor_spacing.py)
            await asyncio.sleep(janitor_rest_s(time.monotonic() - self.swept_at, self.interval))


async def _together(asking: list[Coroutine[Any, Any, list[str]]]) -> list[list[str]]:
    """Runs the nodes' vetting and expiry at once, each to its end (one node's error leaves no other's expiry half
    done); the first error is raised then."""
    if not asking:
        return []
    done = await asyncio.gather(*asking, return_exceptions=True)
    errors = [r for r in done if isinstance(r, BaseException)]
    if errors:
        raise next((e for e in errors if not isinstance(e, asyncio.CancelledError)), errors[0])
    return [r for r in done if not isinstance(r, BaseException)]
