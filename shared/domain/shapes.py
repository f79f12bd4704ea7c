"""Shape checks for the Kubernetes JSON our servers accept: types, lengths and counts, before any rule.

Pure and linear in the size of what they look at. Every problem is one line that starts with the
field (`spec.containers[2].resources: ...`), shows the value (truncated, never a whole object) and
says what is allowed, so a user or an operator can act on it. The rules (shared/domain/request.py,
shared/domain/admission.py) only ever see values of the types checked here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# Kubernetes sets no limit on containers per pod; 1024 (app + init together) is far above any real
# pod and keeps a review's work bounded: every rule is linear in it.
MAX_CONTAINERS = 1024
# Real quantities are a few characters ("96", "1500m", "4k"); a longer value is garbage, refused
# before any parsing (a 5000-digit number would otherwise reach int()).
MAX_QUANTITY_CHARS = 64
# kube-scheduler sends at most the cluster's nodes; Kubernetes supports 5000 per cluster.
MAX_NODES = 10_000
MAX_NAME_CHARS = 253  # DNS-1123 subdomain: pod and node names, also the bound for names we echo
MAX_UID_CHARS = 128  # API server uids are 36-character UUIDs
MAX_PROBLEMS = 20  # a message lists this many problems, then counts the rest
_SHOWN_CHARS = 64

_LABEL_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SUBDOMAIN_RE = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
_NAMES_CHARS_RE = re.compile(r"[-a-z0-9.\n]*")
# in "\n"-joined names: an empty label, a label starting or ending with "-", an empty name
_BAD_PAIRS = ("..", ".-", "-.", "\n-", "-\n", "\n.", ".\n", "\n\n")
_UID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class Problems:
    """Problem lines, keeping the first MAX_PROBLEMS and counting the rest (memory stays bounded)."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.dropped = 0

    def add(self, text: str) -> None:
        if len(self.items) < MAX_PROBLEMS:
            self.items.append(text)
        else:
            self.dropped += 1

    def bad(self, field: str, value: object, allowed: str) -> None:
        if len(self.items) < MAX_PROBLEMS:  # formatted only when kept
            self.items.append(problem(field, value, allowed))
        else:
            self.dropped += 1

    def __bool__(self) -> bool:
        return bool(self.items)

    def lines(self) -> list[str]:
        return self.items + ([f"and {self.dropped} more problems"] if self.dropped else [])


class ShapeError(ValueError):
    """A value of the wrong type, length or count; str() names the field, the value and what is allowed."""

    def __init__(self, field: str, value: object, allowed: str):
        super().__init__(problem(field, value, allowed))
        self.field = field


def describe(value: object) -> str:
    """A short rendering of any JSON value: containers by size only, long strings truncated."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        # repr() of a huge int is slow and refused above 4300 digits; JSON ints from orjson fit 64 bits
        return str(value) if -(10**20) < value < 10**20 else f"an integer of {value.bit_length()} bits"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        if len(value) <= _SHOWN_CHARS:
            return repr(value)
        return f"{value[:_SHOWN_CHARS]!r}... ({len(value)} characters)"
    if isinstance(value, list):
        return f"a list of {len(value)} items"
    if isinstance(value, dict):
        return f"an object with {len(value)} keys"
    return f"a {type(value).__name__}"


def printable(text: str) -> str:
    """`text` with every character that is not printable (C0 and C1 controls, line breaks, bidi overrides and other
    format characters) written as its escape, `\\x1b`, `\\n`, `\\u202e`, as repr() writes it, and no quotes added:
    text someone else chose, shown to a person (a log line, a terminal), cannot break the line, move the cursor or
    reorder what follows it."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


# What a log line or an event lists of the nodes (or other items) a call or a list named: this many, each cut to
# LISTED_CHARS, then how many more. Listed whole, one preempt call's line named up to 10,000 nodes with their errors
LISTED = 10
LISTED_CHARS = 300


def listed(items: Sequence[str], limit: int = LISTED, sep: str = "; ", chars: int = LISTED_CHARS) -> str:
    """The first `limit` items joined, each cut to `chars` (saying how long it was), and how many more."""
    shown = [i if len(i) <= chars else f"{i[:chars]}... ({len(i)} characters)" for i in items[:limit]]
    if len(items) > limit:
        shown.append(f"and {len(items) - limit} more")
    return sep.join(shown)


def problem(field: str, value: object, allowed: str) -> str:
    return f"{field}: got {describe(value)}; allowed: {allowed}"


def key_path(parent: str, key: object) -> str:
    """`limits["mthreads.com/vgpu"]`: keys with dots or slashes stay readable (long keys truncated)."""
    text = key if isinstance(key, str) else describe(key)
    shown = json.dumps(text[:_SHOWN_CHARS], ensure_ascii=False)
    return f"{parent}[{shown}{'...' if len(text) > _SHOWN_CHARS else ''}]"


def is_dns_label(name: object, limit: int = 63) -> bool:
    return isinstance(name, str) and 0 < len(name) <= limit and _LABEL_RE.fullmatch(name) is not None


def is_dns_subdomain(name: object) -> bool:
    """RFC 1123 subdomain (node and pod names): dot-separated labels, each alphanumeric at both ends.

    Called for every node name of a filter call, so one regex (on at most 253 characters, checked
    first) plus three substring tests rather than a regex per label.
    """
    return (isinstance(name, str) and 0 < len(name) <= MAX_NAME_CHARS and _SUBDOMAIN_RE.fullmatch(name) is not None
            and ".." not in name and ".-" not in name and "-." not in name)


def first_bad_name(names: list[Any]) -> int | None:
    """Index of the first element that is not a DNS-1123 subdomain (None: all are).

    kube-scheduler sends up to thousands of names per call: the names are joined and checked at
    once (allowed characters, then no label starting or ending badly), and checked one by one
    only to find which one is bad.
    """
    try:
        joined = "\n".join(names)
    except TypeError:  # not all strings
        joined = ""
    if (joined and joined.count("\n") == len(names) - 1  # no name holds the separator itself
            and max(map(len, names)) <= MAX_NAME_CHARS and _NAMES_CHARS_RE.fullmatch(joined) is not None
            and joined[0] not in "-.\n" and joined[-1] not in "-.\n"
            and not any(pair in joined for pair in _BAD_PAIRS)):
        return None
    return next((i for i, n in enumerate(names) if not is_dns_subdomain(n)), None)


def is_uid(uid: object) -> bool:
    return isinstance(uid, str) and 0 < len(uid) <= MAX_UID_CHARS and _UID_RE.fullmatch(uid) is not None


def optional_str(obj: Mapping[str, Any], key: str, field: str, problems: Problems,
                 limit: int = MAX_NAME_CHARS) -> None:
    value = obj.get(key)
    if value is not None and not (isinstance(value, str) and len(value) <= limit):
        problems.bad(field, value, f"a string of at most {limit} characters")


def _entries(value: object, field: str, problems: Problems, allowed: str) -> Iterable[tuple[Any, Any]]:
    """The entries of an optional object field: none when it is null, or when it is no object (reported)."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        problems.bad(field, value, allowed)
        return ()
    return value.items()


def string_map(value: object, field: str, problems: Problems) -> None:
    """null or an object of string values (annotations, labels, nodeSelector)."""
    for k, v in _entries(value, field, problems, "an object of string values"):
        if not isinstance(v, str):
            problems.bad(key_path(field, k), v, "a string")


def _quantities(value: object, field: str, problems: Problems) -> None:
    for k, v in _entries(value, field, problems, "an object of resource quantities"):
        if isinstance(v, str):
            if len(v) > MAX_QUANTITY_CHARS:
                problems.bad(key_path(field, k), v, f"a quantity of at most {MAX_QUANTITY_CHARS} characters")
        elif isinstance(v, bool) or not isinstance(v, (int, float)):
            problems.bad(key_path(field, k), v, "a quantity (a string or a number)")
        elif isinstance(v, int) and not -(2**63) <= v < 2**64:
            problems.bad(key_path(field, k), v, "a quantity of at most 64 bits")


def _container(c: object, field: str, problems: Problems) -> None:
    if not isinstance(c, dict):
        problems.bad(field, c, "a container object")
        return
    optional_str(c, "name", f"{field}.name", problems)
    res = c.get("resources")
    if res is not None:
        if not isinstance(res, dict):
            problems.bad(f"{field}.resources", res, "an object with limits and requests")
        else:
            _quantities(res.get("limits"), f"{field}.resources.limits", problems)
            _quantities(res.get("requests"), f"{field}.resources.requests", problems)
    sc = c.get("securityContext")
    if sc is not None:
        if not isinstance(sc, dict):
            problems.bad(f"{field}.securityContext", sc, "an object")
        elif sc.get("privileged") is not None and not isinstance(sc.get("privileged"), bool):
            problems.bad(f"{field}.securityContext.privileged", sc.get("privileged"), "true or false")


def pod_problems(pod: object, prefix: str = "") -> list[str]:
    """Every shape problem of the pod fields the rules read (empty list: the rules can run).

    `prefix` is prepended to field names (`Pod.` in extender arguments).
    """
    if not isinstance(pod, dict):
        return [problem(prefix.rstrip(".") or "pod", pod, "a Pod object")]
    problems = Problems()
    meta = pod.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        problems.bad(f"{prefix}metadata", meta, "an object")
    elif isinstance(meta, dict):
        for key in ("name", "generateName", "namespace", "uid"):
            optional_str(meta, key, f"{prefix}metadata.{key}", problems)
        string_map(meta.get("annotations"), f"{prefix}metadata.annotations", problems)
        string_map(meta.get("labels"), f"{prefix}metadata.labels", problems)
    spec = pod.get("spec")
    if spec is None:
        return problems.lines()
    if not isinstance(spec, dict):
        problems.bad(f"{prefix}spec", spec, "a PodSpec object")
        return problems.lines()
    for key in ("schedulerName", "nodeName"):
        optional_str(spec, key, f"{prefix}spec.{key}", problems)
    total = 0
    for key in ("initContainers", "containers"):
        items = spec.get(key)
        if items is None:
            continue
        if not isinstance(items, list):
            problems.bad(f"{prefix}spec.{key}", items, "a list of containers")
            continue
        total += len(items)
    if total > MAX_CONTAINERS:
        # checked before looking at any container, so a huge list costs one len()
        problems.add(f"{prefix}spec: {total} containers and initContainers; allowed: at most "
                     f"{MAX_CONTAINERS} in all")
        return problems.lines()
    for key in ("initContainers", "containers"):
        items = spec.get(key)
        if isinstance(items, list):
            for i, c in enumerate(items):
                _container(c, f"{prefix}spec.{key}[{i}]", problems)
    return problems.lines()
