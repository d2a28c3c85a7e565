"""Async Redis clients for the gateway's many concurrent connections.

redis-py's default async pool raises MaxConnectionsError once 100 commands are in flight (seen
in the soak with 200 clients); a blocking pool makes the 101st command wait for a connection
instead, bounded by `wait_s`, so a burst slows down rather than failing requests.
"""
from __future__ import annotations

import redis.asyncio as aioredis

POOL_SIZE = 100


def shared_client(url: str, wait_s: float = 5.0, **options) -> aioredis.Redis:
    pool = aioredis.BlockingConnectionPool.from_url(url, max_connections=POOL_SIZE, timeout=wait_s, **options)
    return aioredis.Redis(connection_pool=pool)
