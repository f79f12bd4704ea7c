"""What an API server's `Retry-After` asks of a client (pure).

Under API Priority and Fairness the API server turns a request down with 429 Too Many Requests before handling
it, and says in `Retry-After` (whole seconds; kube-apiserver raises it while it keeps dropping requests) when to
come back. Sent again sooner, the request only adds to the load that turned it down; never sent again, a Binding
or a read fails that would have worked a second later. A 429 is never handled, so any verb may go again.
"""

from __future__ import annotations

RETRY_AFTER_MIN_S = 0.2  # "Retry-After: 0" is no licence to ask again in a tight loop
RETRY_AFTER_MAX_S = 30.0  # what is honoured of a longer one: a role that waits longer is unready anyway


def retry_after_s(value: str | None) -> float | None:
    """The wait a Retry-After header asks for, within [RETRY_AFTER_MIN_S, RETRY_AFTER_MAX_S]; None when there is
    none, or it is not a number of seconds (an HTTP date: the API server never sends one)."""
    try:
        seconds = float((value or "").strip())
    except ValueError:
        return None
    if seconds != seconds or seconds < 0:  # NaN or negative: no number of seconds
        return None
    return min(max(seconds, RETRY_AFTER_MIN_S), RETRY_AFTER_MAX_S)


def status_retry_after(status: object) -> float | None:
    """The wait a Status object asks for in `details.retryAfterSeconds` (as retry_after_s bounds it): all a watch
    stream's ERROR event can say (it has no headers), and the body's copy of a Retry-After a proxy dropped. The API
    server sets it on its 429s and on its 504 "Too large resource version" (a replica behind the version asked)."""
    details = status.get("details") if isinstance(status, dict) else None
    asked = details.get("retryAfterSeconds") if isinstance(details, dict) else None
    if isinstance(asked, bool) or not isinstance(asked, int | float):
        return None
    return retry_after_s(str(asked))


def wait_to_resend(status: int, retry_after: float | None, left: float) -> float | None:
    """How long to wait before sending again a request answered `status`, with `left` seconds for it; None: do
    not send it again. Only a 429 that says when (the request was not handled) and only when the wait fits."""
    if status != 429 or retry_after is None or retry_after > left:
        return None
    return retry_after
