"""Throwaway real Redis for tests, benchmarks and the quick start: a standalone redis-server
(deploy/local/redis_server.py), and for the failover tests a Sentinel setup and a Redis Cluster
(deploy/local/redis_ha.py), all on 127.0.0.1 without persistence. Imported from here by callers."""

from __future__ import annotations

from deploy.local.processes import free_port
from deploy.local.redis_ha import FAST_SYNC, ClusterSetup, SentinelSetup, wait_caught_up
from deploy.local.redis_server import RedisServer, ServerTLS, kill, new_password, terminate, wait_until

__all__ = ["FAST_SYNC", "ClusterSetup", "RedisServer", "SentinelSetup", "ServerTLS", "free_port", "kill",
           "new_password", "terminate", "wait_caught_up", "wait_until"]
