"""How long a Binding may be in flight, and how long the watchers wait before their truth must have it (pure).

The extender books a pod's cards in Redis, then writes its Binding. If Redis then loses that booking (a
restart from an older snapshot, a failover), the node is fenced (docs/redis-layout.md "Losing Redis") until
the watchers have written it from a truth that has every Binding that was in flight. That is a bound, not a
hope, because both sides of it are set here:

- the extender sends each Binding only within `bind_deadline_s` of starting its reservation, and what is left
  then goes to getting a connection (at most BIND_CONNECT_S, aiohttp's `connect` timeout) and to the API
  server's own deadline for the request (its `timeout` parameter, counted from its receipt): a Binding the
  server has not committed by the end of that deadline it abandons (controller/extender.py, shared/kube.py
  `raw`);
- the watchers verify a node only with pods read consistently from the API server, in a read begun
  KEEP_MS after the node was first found unverified (shared/store/lua/_lib.lua `verify_after`).

KEEP_MS - BIND_DEADLINE_S is the margin for what neither side measures: a request's wait before the API
server reads it, etcd applying a write its client gave up on, the clocks' rates. The pending TTL bounds a
booking's life the same way, so the deadline is also at most half of it.
"""

from __future__ import annotations

KEEP_MS = 10_000  # the watchers' keep window: a booking younger than this is newer than any view
BIND_DEADLINE_S = 5.0  # from the start of a reservation to the API server's deadline for its Binding
BIND_MIN_LEFT_S = 0.5  # less than this left once booked: the Binding is not sent (the booking is given back)
BIND_CONNECT_S = 1.0  # at most this of what is left goes to getting a connection; the rest is the server's
BIND_ANSWER_SLACK_S = 2.0  # how much longer than the deadline the extender waits for the answer
BIND_SETTLE_S = 1.0  # after the server's deadline, before a read may say the Binding will never exist
# One read of a pod or node by bind (before the reservation, and after a Binding without a clear answer): a bind
# makes at most three of them and its Binding (deadline + BIND_ANSWER_SLACK_S), 3 x 4 + 7 = 19 s, so a stalled API
# server still gets kube-scheduler its answer within the extender's httpTimeout (30 s by default) rather than after
# it (a read's own default is 30 s: one of them alone used it up).
BIND_READ_S = 4.0  # (a read answered 429 waits its Retry-After in it, up to READ_PATIENCE_S: shared/kube.py)

assert BIND_DEADLINE_S * 1000 <= KEEP_MS / 2, "the keep window must leave a margin as long as the bind deadline"


def bind_deadline_s(pending_ttl_seconds: float) -> float:
    """The Binding's deadline: within the pending TTL's first half too, so the janitor never expires a
    booking whose Binding may still be committed."""
    return min(BIND_DEADLINE_S, pending_ttl_seconds / 2)


# The node watcher handles a node's change at most once per this many seconds (controller/node_watch.py, through
# shared/domain/coalesce.py): the changes that come meanwhile collapse to the newest, so a Node object changed in a
# tight loop (a flapping kubelet, a stolen kubelet identity) costs the watcher one handling a second, not one per
# change. A node with no change for this long is handled at once. Kubelets post status every 10 s or more.
NODE_EVENT_MIN_INTERVAL_S = 1.0


# The janitor (controller/janitor.py) sweeps for pending bookings past pendingTTLSeconds every JANITOR_INTERVAL_S,
# counted from each sweep's clock (Janitor.swept_at, read at its start after its first Redis call; a sweep longer than
# that is followed at once by the next). Before it expires one
# it reads its pod from the API server (PodWatcher.api_holds; shared/domain/janitor_reads.py): a read not answered
# within API_HOLDS_READ_S keeps the booking until a later sweep, and holds back the sweep's reads not begun yet for
# as long, so a sweep waits on an API server that does not answer about once, not once per pod or node.
JANITOR_INTERVAL_S = 5.0
API_HOLDS_READ_S = 5.0
# At most this many of those reads at once, over every node of a sweep (one semaphore per pod watcher). The nodes'
# reads overlap, so a sweep that reads R pods, each answered in d seconds, takes about ceil(R / 8) x d, not R x d
# (nodes were swept one by one: a slow API server held every stale booking of the last node R x d longer). Eight,
# not one per booking: bookings reach the janitor when their binders died or gave up (an extender killed with its
# binds in flight leaves a burst of them at once), and the burst must not become a burst of GETs at an API server
# that is slow already: eight in flight is a small share of an API Priority and Fairness level's seats and of the
# client's 64 pooled connections (shared/kube.py: as many as its best-effort Events, BEST_EFFORT_IN_FLIGHT), and a
# burst of up to eight bookings still costs a sweep one read's time.
API_HOLDS_READS = 8


def janitor_rest_s(took_s: float, interval_s: float = JANITOR_INTERVAL_S) -> float:
    """How long the janitor waits after a sweep whose clock was read `took_s` ago: sweeps' clocks `interval_s`
    apart at least (the TTL is judged between them), and a sweep that took longer is followed at once by the next
    (its reads' time does not push every later sweep back: pending_release_bound_s)."""
    return max(0.0, interval_s - took_s)


def janitor_sweep_s(reads: int, read_s: float, in_flight: int = API_HOLDS_READS) -> float:
    """How long a sweep's reads of pods take (its Redis round trips left out): `reads` pods, each answered in
    `read_s` seconds (at most API_HOLDS_READ_S: one not answered by then holds the rest back), `in_flight` at once."""
    return -(-reads // in_flight) * min(read_s, API_HOLDS_READ_S) if reads > 0 else 0.0


def pending_release_bound_s(pending_ttl_seconds: float, sweep_s: float,
                            interval_s: float = JANITOR_INTERVAL_S) -> float:
    """The latest a pending booking whose binder died is released, counted from its reservation, when no sweep takes
    longer than `sweep_s` (janitor_sweep_s, plus its Redis round trips) and the API server answers its reads
    (a booking it cannot be asked about is kept: fail closed). The janitor dates a booking at the start of the sweep
    that first sees it (on its own monotonic clock too: shared/domain/reconcile.py pending_since; taken before the
    sweep's first round trip to Redis), at most a period after it was made; expires it at the first sweep that
    starts at least pendingTTLSeconds after that; and sends its expiry within that sweep. Sweeps start every
    `interval_s` while none takes longer, so the TTL ends on a sweep's start rounded up to the period: interval +
    ceil(TTL / interval) x interval + sweep (the TTL + 5 s + the sweep, at the default 120 s); longer sweeps follow
    one another at once, and the bound is then TTL + 3 x sweep."""
    if sweep_s <= interval_s:
        return interval_s + -(-pending_ttl_seconds // interval_s) * interval_s + sweep_s
    return pending_ttl_seconds + 3 * sweep_s
