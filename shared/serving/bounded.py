"""A least-recently-used map bounded by the bytes its entries hold, not by how many there are.

The caller gives each entry's size (an estimate of what it keeps alive). A count bound is no bound
when one entry can be a megabyte (a pod annotation can be); this one holds at most `max_bytes`,
and refuses entries above `max_entry_bytes` so one huge entry cannot flush everything else.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class ByteLRU(Generic[K, V]):
    def __init__(self, max_bytes: int, max_entry_bytes: int | None = None):
        self.max_bytes = max_bytes
        self.max_entry_bytes = max_bytes if max_entry_bytes is None else min(max_entry_bytes, max_bytes)
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def put(self, key: K, value: V, size: int) -> bool:
        """Store (most recent); False when the entry alone is over `max_entry_bytes` (not stored)."""
        self.pop(key)
        if size > self.max_entry_bytes:
            return False
        self._items[key] = (value, size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, (_, old) = self._items.popitem(last=False)
            self.bytes -= old
        return True

    def get(self, key: K) -> V | None:
        item = self._items.get(key)
        if item is None:
            return None
        self._items.move_to_end(key)
        return item[0]

    def pop(self, key: K) -> V | None:
        item = self._items.pop(key, None)
        if item is None:
            return None
        self.bytes -= item[1]
        return item[0]
