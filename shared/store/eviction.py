"""Which Redis eviction policies the ledger can live with: the twin of `evicting_policy` in lua/_lib.lua.

A Redis at its `maxmemory` drops keys by its `maxmemory-policy`. `allkeys-*` drops any key: a node's hash, a
card's, a reservation's, a booking a running pod holds among them. `volatile-*` drops only keys with a time to
live, and no key of ours has one (tests/redis/test_eviction_policy.py), so when full it refuses our writes like
`noeviction`, which the readiness probe reports. Two defences:

- no booking on a server whose policy is `allkeys-*`: checked atomically by every booking (reserve.lua) and by
  every role's readiness probe (Ledger.probe_write), on each primary of a Cluster that answers;
- every eviction, of any key, changes the server's history token (`server_info` in lua/_lib.lua), so every node
  there waits for the watchers' comparison with the API server, as after a restart, and a node whose hash was
  dropped is not taken for a new one: keys dropped before the policy was set right come back from the API.
"""

from __future__ import annotations

EVICTING = "Redis evicts keys"  # reserve.lua's refusal starts so; no plan on any node can help


def evicts_ledger(policy: str) -> bool:
    """Whether a Redis with this `maxmemory_policy` (INFO memory) may drop a ledger key when full. Whatever its
    `maxmemory` says now: a limit can be set at any time (CONFIG SET), and the policy says what it then does."""
    return policy.startswith("allkeys-")


def eviction_refusal(policy: str) -> str:
    """Why nothing is booked, readiness and reserve.lua alike (the same words: the Lua twin builds them too)."""
    return (f"{EVICTING} (maxmemory-policy {policy}): when full it may drop a booking a running pod holds, unseen; "
            "no booking until it is set to noeviction (or a volatile-* policy: no ledger key has a time to live)")
