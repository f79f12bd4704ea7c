"""Ended pods' tombstones: a pod the pod watcher saw end is never booked again on its node (pure).

The pod watcher's release of a pod that ended (deleted, or Succeeded/Failed) writes the pod's uid into its node's
`ended` hash (`<prefix>:{<node>}:ended`, docs/redis-layout.md), in the same script as the release. A write read from
a view taken before the pod ended can reach Redis after that release: a held-back record's `observe`
(controller/pod_watch.py confirm_due), a node written with its holders (controller/node_watch.py), a repair or
rebuild from a list read before the deletion (controller/reconciler.py). Each books a bound pod whatever it
over-commits (the API server is the truth), so booked again it would over-fill a card another pod took
meanwhile. The scripts book no uid the hash holds (observe.lua answers `ended`, replace_node.lua leaves it out
of `bound`): Kubernetes never reuses a uid, so a tombstoned pod never needs booking again.

This module is the rule; `tombstoned`, `next_trim` and `trim_due` in shared/store/lua/_lib.lua are its twins
(tests/redis/test_ended_twin.py runs one table through both).
"""

from __future__ import annotations

# How long a tombstone is kept (ms, Redis's clock). Long enough for every write read before the pod ended:
# an observe in flight ends within the ledger's resends (retry_seconds, 3 s), a node watcher's write of holders
# within its calls, a reconciler's repair within one pass after its list (its keep window, timing.KEEP_MS, is
# 10 s); the pod watcher remembers an ended pod as long (controller/pod_watch.py ENDED_SECONDS, derived from
# this), and so do the watchers' "release again" checks that back the tombstone up.
ENDED_KEEP_MS = 600_000
# The node's tombstones are trimmed (those past ENDED_KEEP_MS dropped) by the write that brings their count since
# the last trim to its `#trim_at`, next_trim of what that trim kept, or the first write once the last trim
# (`#trimmed`) is past the keep window (trim_due): the hash holds at most about twice the tombstones of the last
# ten minutes (and this floor), also long after a burst, and each write pays for about one tombstone read.
ENDED_TRIM_FLOOR = 64


def tombstoned(ended_at_ms: int | None, now_ms: int) -> bool:
    """Whether a uid tombstoned at `ended_at_ms` (None: not in the set) may not be booked at `now_ms`.
    A stamp from a clock that ran ahead (later than now) still counts: a uid is never reused."""
    return ended_at_ms is not None and now_ms - ended_at_ms <= ENDED_KEEP_MS


def next_trim(kept: int) -> int:
    """The count of tombstones at which the next trim comes, after one that kept `kept` (tombstoned ones)."""
    return max(ENDED_TRIM_FLOOR, 2 * kept)


def trim_due(count: int, trim_at: int, trimmed_at_ms: int | None, now_ms: int) -> bool:
    """Whether the write that brings the count of tombstones written since the last trim to `count` trims: at
    `trim_at` (next_trim of what the last trim kept), or when the last trim (`trimmed_at_ms`, None: none yet) is
    past the keep window, so that a burst's tombstones do not stay in the hash, stale, until as many new ones come
    (a clock that stepped back: not by time, until it is past the window again)."""
    return count >= trim_at or trimmed_at_ms is None or now_ms - trimmed_at_ms > ENDED_KEEP_MS
