"""The janitor's reads of pods from the API server, judged (pure): which pending bookings past pendingTTLSeconds it
reads the pod of before expiring them, and what each answer means. The reads themselves, their turns (at most
API_HOLDS_READS at once across every node of a sweep: shared/domain/timing.py) and their timeout are
controller/pod_watch.py's `PodWatcher.api_holds`; the expiry, one expire.lua per node, is controller/janitor.py's.

A booking reaches these only when the pod view is live (none is read while it is blind: `Janitor._blind`, and at a
read's turn `PodWatcher.reads_blind`) and the watcher's own confirmation (`confirm_now`) did not keep it. Then, in
this order:

- no pod name was recorded with it: nothing in the API can hold it, it is expired unread;
- the pod view holds the pod bound on that node: kept unread (`view_bound`; its record is booked by the view, or,
  with none it can book, kept for the pod's life as the reconciler keeps it);
- a read went unanswered a moment ago (reads held back): kept unread (`api_unanswered`), so a sweep waits on an API
  server that does not answer once, not once per pod;
- else its pod is read. Bound on that node (same uid, not ended): kept (`api_bound`); gone (404), another pod of
  that name, ended, unbound or bound elsewhere: expired; any other error, or no answer: kept (`api_unanswered`:
  fail closed), and no answer at all (a timeout, the connection lost) holds the reads back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from shared.domain.quota import is_terminal

# what becomes of a booking: read its pod, expire it, or keep it (the `why` of mtsched_janitor_kept_total)
Verdict = Literal["read", "expire", "view_bound", "api_bound", "api_unanswered"]
KEPT: frozenset[Verdict] = frozenset({"view_bound", "api_bound", "api_unanswered"})
# the API server's answer to the GET of a pod: the pod; the status of an error answer (404: gone); None: no answer
Answer = Mapping[str, Any] | int | None


def pod_name(ref: str) -> tuple[str, str] | None:
    """(namespace, name) of a booking's recorded pod `namespace/name`; None when it names none."""
    ns, _, name = ref.partition("/")
    return (ns, name) if ns and name else None


def before_read(node: str, ref: str, view_node: str | None, reads_held: bool) -> Verdict:
    """What becomes of a pending booking on `node` past the TTL (its pod `ref`) before any read: `view_node` is the
    node the pod view holds the pod bound on (None: not bound there, or not in the view); `reads_held`: a read went
    unanswered a moment ago. "read" when only the API server can say."""
    if pod_name(ref) is None:
        return "expire"  # no pod name was recorded: nothing in the API can hold it
    if view_node == node:
        return "view_bound"
    if reads_held:
        return "api_unanswered"
    return "read"


def after_read(uid: str, node: str, answer: Answer) -> Verdict:
    """What the API server's answer to the read of the pod of booking `uid` on `node` means for the booking."""
    if isinstance(answer, Mapping):
        meta, spec = answer.get("metadata") or {}, answer.get("spec") or {}
        if str(meta.get("uid")) != uid or is_terminal(answer) or spec.get("nodeName") != node:
            return "expire"  # gone (another pod of that name), ended, or not bound there: its binder left it
        return "api_bound"
    if answer == 404:
        return "expire"
    return "api_unanswered"  # an error answer (5xx, 403, ...) or none: we cannot tell (fail closed)


def answered(answer: Answer) -> bool:
    """Whether the API server answered the read (a pod, or 404): an episode of reads it could not answer ends."""
    return isinstance(answer, Mapping) or answer == 404


def holds_reads(answer: Answer) -> bool:
    """Whether the reads not begun yet are held back after this answer (API_HOLDS_READ_S): none came at all (a
    timeout, the connection lost). An error answer (5xx, 403) came quickly: the next pod is still read."""
    return answer is None
