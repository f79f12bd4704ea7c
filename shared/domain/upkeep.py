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
that stamp has not changed, been gone or unreadable (controller/upkeep.py Upkeep): `age_ms` is the larger count.
"""

from __future__ import annotations

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
