"""The ledger's Redis key names, and the KEYS list of every script (docs/redis-layout.md).

Every key a script reads or writes is declared in its KEYS (Redis Cluster requires it): KEYS[1] is the
node hash, the rest are the node's pods set, its tombstones (`ended`), card hashes and reservation hashes, all
under the node's hash tag `{<node>}`, so every call stays on one slot. Which cards and reservations a node has only
Redis knows: callers pass the ones they last saw (`Known`); a script that needs one more answers
MOREKEYS with the lists to declare before it writes anything (`_lib.lua: need_keys`), and the ledger calls
again. The global keys (`<prefix>:nodes`, `<prefix>:epoch`, `<prefix>:kept`) are never read or written by a
script (`<prefix>:kept` only routes the clock script to the server holding it: Ledger._kept_clock).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import orjson

MOREKEYS = "MOREKEYS "  # the error reply's prefix (see _lib.lua: need_keys)
DAMAGED = "DAMAGED "  # the error reply's prefix when a script deleted keys of another type (_lib.lua: clear_damage)
CLEAR = "clear"  # ARGV[4] of a script called again after WRONGTYPE: delete the declared keys of another type first


@dataclass(frozen=True)
class Known:
    """A node's card indices and reservation uids as last seen (declared in KEYS when a script may need them)."""

    cards: frozenset[str] = frozenset()
    uids: frozenset[str] = frozenset()

    def learn(self, reply: str) -> Known:
        """What a MOREKEYS reply says: the node's complete lists (`whole`), or more of them."""
        d = orjson.loads(reply[len(MOREKEYS):])
        cards = frozenset(str(c) for c in (d.get("cards") or []))  # cjson sends an empty list as {}
        uids = frozenset(str(u) for u in (d.get("uids") or []))
        if d.get("whole"):
            return Known(cards, uids)
        return Known(self.cards | cards, self.uids | uids)


NOTHING = Known()


@dataclass(frozen=True)
class Layout:
    """Key names under one prefix (`keyPrefix`, default `mt`)."""

    prefix: str = "mt"

    @property
    def nodes(self) -> str:
        return f"{self.prefix}:nodes"

    @property
    def epoch(self) -> str:
        return f"{self.prefix}:epoch"

    @property
    def kept(self) -> str:
        """Redis's clock (ms) when a ready watcher last stamped the ledger (Ledger.mark_kept, domain/upkeep.py)."""
        return f"{self.prefix}:kept"

    @property
    def probe(self) -> str:
        """Written by every role's readiness probe (Ledger.probe_write); read by nobody."""
        return f"{self.prefix}:probe"

    @property
    def feed(self) -> str:
        """The Pub/Sub channel (not a key: PUBLISH is not routed by slot)."""
        return f"{self.prefix}:feed"

    def base(self, node: str) -> str:
        return f"{self.prefix}:{{{node}}}"

    def node(self, node: str) -> str:
        return f"{self.base(node)}:node"

    def pods(self, node: str) -> str:
        return f"{self.base(node)}:pods"

    def slot_probe(self, node: str) -> str:
        """Never written: named beside the node's hash to ask whether its slot is being moved (Ledger.slot_open)."""
        return f"{self.base(node)}:slot-probe"

    def ended(self, node: str) -> str:
        """The node's tombstones: a hash of the uids of pods that ended, each with when (ms), and its trim's `#n`,
        `#trim_at` and `#trimmed` (shared/domain/ended.py)."""
        return f"{self.base(node)}:ended"

    def card(self, node: str, index: int | str) -> str:
        return f"{self.base(node)}:card:{index}"

    def res(self, node: str, uid: str) -> str:
        return f"{self.base(node)}:res:{uid}"

    def _keys(self, node: str, cards: Iterable[int | str] = (), uids: Iterable[str] = (),
              pods: bool = True, ended: bool = False) -> list[str]:
        keys = [self.node(node)] + ([self.pods(node)] if pods else []) + ([self.ended(node)] if ended else [])
        keys += sorted({self.card(node, c) for c in cards})
        keys += sorted({self.res(node, u) for u in uids})
        return keys

    # -- one function per script ---------------------------------------------------------------
    # `known`: what the caller last saw of the node; the script asks for more if it needs it.

    def upsert_node(self, node: str, cards: Iterable[int], known: Known) -> list[str]:
        """The node, its tombstones (made with the node: ensure_ended in _lib.lua), the reported cards and those it
        has (a card no longer reported is marked or deleted)."""
        return self._keys(node, [*cards, *known.cards], pods=False, ended=True)

    def reserve(self, node: str, uid: str, cards: Iterable[int], known: Known) -> list[str]:
        """The node, pods, the uid's reservation, the cards to book, and every card and reservation the
        node has (sent back with a refusal, so the caller refits without another read)."""
        return self._keys(node, [*cards, *known.cards], [uid, *known.uids])

    def mark_bound(self, node: str, *uids: str) -> list[str]:
        """The node, pods (a reservation it does not list is none: res_of in _lib.lua) and the reservations to
        mark (one bind's, or a batch of them)."""
        return self._keys(node, (), uids)

    def release(self, node: str, uid: str, known: Known, ended: bool = False) -> list[str]:
        """The node, pods, the reservation and the cards it holds (any of the node's); its tombstones only for the
        release of a pod that ended (`ended`): a binder's give-back names no key it does not touch, so it names none
        Redis Cluster may lack while the node's slot moves (a missing key named there is refused, TRYAGAIN)."""
        return self._keys(node, known.cards, [uid], ended=ended)

    def observe(self, node: str, uid: str, cards: Iterable[int], known: Known) -> list[str]:
        """As release, plus the cards the pod's record names (a different booking is replaced)."""
        return self._keys(node, [*cards, *known.cards], [uid], ended=True)

    def whole_node(self, node: str, known: Known) -> list[str]:
        """snapshot and expire: every key of the node but its tombstones."""
        return self._keys(node, known.cards, known.uids)

    snapshot = expire = whole_node

    def remove_node(self, node: str, known: Known) -> list[str]:
        """Every key of the node, its tombstones too."""
        return self._keys(node, known.cards, known.uids, ended=True)

    def replace_node(self, node: str, cards: Iterable[int], bound: Iterable[tuple[str, Iterable[int]]],
                     known: Known) -> list[str]:
        """Every key of the node, the reported cards, and each bound pod's reservation and cards."""
        pairs = list(bound)
        named = [c for _uid, cs in pairs for c in cs]
        return self._keys(node, [*cards, *named, *known.cards], [*(u for u, _cs in pairs), *known.uids], ended=True)
