"""Whether the ledger is kept current by a watcher, the extenders' gate (pure).

Only the watchers apply what the API server says to the ledger: pods deleted give their cards back, nodes and
cards that change or go are written, drift is repaired. With none of them running (every replica crashed, or
all pointed at another Redis or `keyPrefix` than the extenders by a per-role override) the extenders would go on
booking on a ledger nobody keeps: cards held for deleted pods look full, an unhealthy card looks fine, and keys
a move left behind under an old prefix are booked as if current. So every ready watcher stamps the ledger
(`<prefix>:kept`, Redis's clock, every KEEP_EVERY_SECONDS), and an extender that reads a stamp older than
`watchersLostAfterSeconds` places no slice pod until a watcher stamps it again (controller/upkeep.py).

No stamp at all is no evidence either way: a Redis that restarted or failed over without it (an empty one holds
no node to book on until a watcher rebuilds it, one with older data only unverified nodes until a watcher compares
them, and a ready watcher stamps it again within KEEP_EVERY_SECONDS), or watchers of a release that did not stamp
yet (a rolling upgrade). An extender that has read a stamp since it started also counts, on its own clock, how long
that stamp has not changed, been gone or unreadable (`seen_again`, `age_of`): `age_ms` is the larger count.
"""

from __future__ import annotations

from dataclasses import dataclass

KEEP_EVERY_SECONDS = 10.0  # a ready watcher's stamp
READ_EVERY_SECONDS = 5.0  # an extender's read of it
LOST_AFTER_MIN = 30  # watchersLostAfterSeconds: at least three stamps missed
LOST_AFTER_MAX = 3600


def unkept_problem(age_ms: int | None, lost_after_seconds: int) -> str:
    """Why no slice pod may be placed now ("" when it may): the last stamp is `age_ms` old on Redis's clock
    (None: no stamp)."""
    if age_ms is None or age_ms <= lost_after_seconds * 1000:
        return ""
    return (f"no watcher has kept the ledger current for {age_ms // 1000} s (watchersLostAfterSeconds is "
            f"{lost_after_seconds}): releases and node changes are not applied, so no slice pod is placed until a "
            "watcher runs again (are the watcher pods down, or pointed at another Redis or keyPrefix?)")


@dataclass(frozen=True)
class Seen:
    """The last stamp an extender read, and when it was written on the extender's own clock (s), at the latest."""

    stamp: int
    written: float


def seen_again(last: Seen | None, stamp: int | None, age_ms: int | None, now: float) -> Seen | None:
    """What the extender knows after a read at `now` (its clock) that found `stamp`, `age_ms` old on Redis's clock
    (None: no stamp, not one this code wrote, or the read failed). A new stamp is dated by Redis's count; the same
    stamp keeps the earlier date (Redis's clock may have stepped back since, the extender's did not); none keeps
    what was seen, which ages on (a stamp deleted, or its shard down, hides no outage)."""
    if stamp is None or age_ms is None:
        return last
    written = now - age_ms / 1000
    if last is None or stamp != last.stamp:
        return Seen(stamp, written)
    return Seen(stamp, min(last.written, written))


def age_of(seen: Seen | None, now: float) -> int | None:
    """The stamp's age (ms) at `now` on the extender's clock; None when it never read one (no verdict)."""
    return None if seen is None else int((now - seen.written) * 1000)
