"""Async Redis clients for the gateway's many concurrent connections.

redis-py's default async pool raises MaxConnectionsError once 100 commands are in flight (seen
in the soak with 200 clients); a blocking pool makes the 101st command wait for a connection
instead, bounded by `wait_s`, so a burst slows down rather than failing requests.
"""
from __future__ import annotations

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError

POOL_SIZE = 100


def shared_client(url: str, wait_s: float = 5.0, **options) -> aioredis.Redis:
    """A pooled client that tries a command again (three times, 50 ms to 0.5 s apart) when its
    connection breaks: after a Redis restart every pooled connection is dead, and without this
    the first command on each fails a request. Timeouts are not retried: a stuck Redis would
    only make callers wait three times as long."""
    options.setdefault("retry", Retry(ExponentialBackoff(cap=0.5, base=0.05), 3, supported_errors=(ConnectionError,)))
    pool = aioredis.BlockingConnectionPool.from_url(url, max_connections=POOL_SIZE, timeout=wait_s, **options)
    return aioredis.Redis(connection_pool=pool)
