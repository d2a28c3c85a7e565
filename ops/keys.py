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
