"""Applying the JSONPatch our webhook answers (pure): what a pod becomes once admitted.

The API server applies the patch itself; this is for whatever must see the admitted form without it
(the benchmark creating pods already admitted, the tests checking the patch means what it says).
Only the operations the webhook sends: RFC 6902 `add` and `replace`, on objects and list indices.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def apply_patch(doc: Mapping[str, Any], ops: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """A deep copy of `doc` with `ops` applied; ValueError for another op or a `replace` of a missing key."""
    out: dict[str, Any] = copy.deepcopy(dict(doc))
    for op in ops:
        if op["op"] not in ("add", "replace"):
            raise ValueError(f"patch op {op['op']!r}: allowed add, replace")
        tokens = [_unescape(t) for t in op["path"].split("/")[1:]]
        target: Any = out
        for t in tokens[:-1]:
            target = target[int(t)] if isinstance(target, list) else target[t]
        last = tokens[-1]
        if isinstance(target, list):
            target[int(last)] = copy.deepcopy(op["value"])
        else:
            if op["op"] == "replace" and last not in target:
                raise ValueError(f"patch: replace of missing {op['path']}")
            target[last] = copy.deepcopy(op["value"])
    return out
