"""Every Redis key and channel Brigade uses, one function per shape.

Keys that can grow carry a TTL or a cap, set where they are written:
- stream(rid): capped at Settings.stream_maxlen entries, TTL Settings.stream_ttl_s
- request(rid): TTL Settings.stream_ttl_s
- cancelled(rid): TTL Settings.cancel_ttl_s
- worker(name): TTL Settings.worker_status_ttl_s, refreshed by the worker while it lives
Channels hold nothing, so they need no bound.
"""
from __future__ import annotations

PREFIX = "brigade"


def reply_channel(gateway_id: str) -> str:
    """Pub/sub channel on which workers deliver a gateway's token events live."""
    return f"{PREFIX}:reply:{gateway_id}"


def stream(request_id: str) -> str:
    """A request's replay log: every event it produced, in order (capped, with TTL)."""
    return f"{PREFIX}:stream:{request_id}"


def request(request_id: str) -> str:
    """The request as enqueued (JSON), kept while it may still be replayed or resumed."""
    return f"{PREFIX}:request:{request_id}"


def cancelled(request_id: str) -> str:
    """Set when a request is cancelled, so a worker that takes it from the queue later skips it."""
    return f"{PREFIX}:cancelled:{request_id}"


CANCEL_CHANNEL = f"{PREFIX}:cancels"  # request ids to stop, broadcast to every worker


def worker(name: str) -> str:
    """A worker's status and heartbeat (JSON, short TTL)."""
    return f"{PREFIX}:worker:{name}"


WORKER_PATTERN = f"{PREFIX}:worker:*"


def interactive_queue(model_name: str) -> str:
    """The Celery queue (a Redis list) of a model's interactive requests."""
    return f"{PREFIX}.{model_name}.interactive"


# ---- the answer cache (cache/) ------------------------------------------------------------------
# Entries and exact keys carry Settings.cache_ttl_s; the sorted sets and the namespace sets hold
# at most Settings.cache_max_entries members (LRU eviction); the log stream is capped.


def cache_entry(entry_id: str) -> str:
    """One cached answer (hash: question, answer chunks, namespace, embedding, hits, ...)."""
    return f"{PREFIX}:cache:entry:{entry_id}"


CACHE_ENTRY_PATTERN = f"{PREFIX}:cache:entry:*"


def cache_exact(digest: str) -> str:
    """Exact-layer key: digest of (model, rendered prompt, output-changing params) -> entry id."""
    return f"{PREFIX}:cache:exact:{digest}"


def cache_namespace(namespace: str) -> str:
    """The entry ids of one namespace (set)."""
    return f"{PREFIX}:cache:ns:{namespace}"


CACHE_NAMESPACE_PATTERN = f"{PREFIX}:cache:ns:*"
CACHE_LRU = f"{PREFIX}:cache:lru"  # sorted set: entry id -> last use (unix seconds)
CACHE_EXPIRY = f"{PREFIX}:cache:expiry"  # sorted set: entry id -> expiry (unix seconds)
CACHE_LOG = f"{PREFIX}:cache:log"  # stream of adds and deletes that every gateway's index follows
CACHE_STATS = f"{PREFIX}:cache:stats"  # hash of counters
