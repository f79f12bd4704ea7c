"""Which of two states of a Kubernetes object is newer, by resourceVersion (pure).

Kubernetes 1.35 made resourceVersions of one resource comparable (KEP-5504: a positive decimal integer without
leading zeros, larger is newer); before, clients were told to treat them as opaque. Where either value is not of
that form nothing is concluded from the numbers, and only the order the watcher received things in is used: an event
the stream delivered before a consistent list was requested is no newer than that list.
"""

from __future__ import annotations


def rv_number(rv: str) -> int | None:
    """`rv` as a comparable number, or None when it is not of the comparable form (opaque: compare nothing)."""
    if not rv or not rv.isascii() or not rv.isdigit() or rv[0] == "0":
        return None
    return int(rv)


def listed_over(event_rv: str, list_rv: str, received_before_list: bool) -> bool:
    """Whether a list (its resourceVersion `list_rv`) is at least as new as a watch event of one of its objects (the
    object's resourceVersion in the event, `event_rv`): then the event must not be applied over what the list wrote.
    `received_before_list`: the stream delivered the event before the list was requested (a consistent list: no
    resourceVersion asked, so read at or after every revision any watch had delivered)."""
    e, listed = rv_number(event_rv), rv_number(list_rv)
    if e is not None and listed is not None:
        return e <= listed
    return received_before_list
