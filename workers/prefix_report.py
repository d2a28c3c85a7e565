"""What this worker's prefix cache holds, told to every gateway (prefix-aware routing,
docs/scaling.md).

After each engine step that stored or evicted prefix blocks (engine/prefix_index.py's journal),
one round trip: the blocks go into the worker's set (`redis_keys.prefix_blocks`, its snapshot, which a
gateway reads when it starts or lost the log) and, as one entry, into the shared log every
gateway's index follows (`redis_keys.PREFIX_LOG`). A step's report goes out before the step's reply
events, so the client that reads a `done` and sends its next turn finds the answer's blocks
already routed to this worker. A report that fails (Redis away) is not retried piecemeal: the
next one is the whole snapshot. A stale report costs a gateway a miss, never a wrong answer.
"""
from __future__ import annotations

import logging
import time

import redis

from engine import Engine
from engine.prefix_index import PrefixChanges
from ops.core import redis_keys
from ops.core.settings import Settings

log = logging.getLogger("brigade.worker")

SADD_CHUNK = 2_000  # keys per SADD when a whole snapshot goes out
RETRY_AFTER_S = 1.0  # after a failed report, the next try waits this long (the engine thread must not)


def hex_key(key: int) -> str:
    return f"{key:016x}"


class PrefixReport:
    def __init__(self, client: redis.Redis, settings: Settings, instance: str, engine: Engine):
        self.redis = client
        self.instance = instance
        self.engine = engine
        self.blocks_key = redis_keys.prefix_blocks(instance)
        self.ttl_s = redis_keys.prefix_ttl_s(settings)
        self.maxlen = redis_keys.prefix_log_maxlen(settings)
        self._failed_at: float | None = None
        engine.watch_prefixes()  # its first changes are a (reset) snapshot, of an empty cache at start

    def publish(self) -> None:
        """On the engine's thread, after a step (before its reply events)."""
        if self._failed_at is not None and time.monotonic() - self._failed_at < RETRY_AFTER_S:
            return
        changes = self.engine.prefix_changes()
        if not changes:
            return
        try:
            self._send(changes)
            self._failed_at = None
        except redis.RedisError as exc:
            if self._failed_at is None:
                log.warning("event=prefix_report_failed error=%r", exc)
            self._failed_at = time.monotonic()
            self.engine.watch_prefixes()  # what was lost is unknown: the next report is a whole snapshot

    def _send(self, changes: PrefixChanges) -> None:
        pipe = self.redis.pipeline(transaction=True)
        entry = {"w": self.instance}
        if changes.reset:
            pipe.delete(self.blocks_key)
            held = [hex_key(k) for k in changes.held]
            for i in range(0, len(held), SADD_CHUNK):
                pipe.sadd(self.blocks_key, *held[i:i + SADD_CHUNK])
            entry["reset"] = "1"  # gateways read the snapshot instead of a list
        else:
            stored = [hex_key(k) for k in changes.stored]
            evicted = [hex_key(k) for k in changes.evicted]
            if stored:
                pipe.sadd(self.blocks_key, *stored)
                entry["s"] = " ".join(stored)
            if evicted:
                pipe.srem(self.blocks_key, *evicted)
                entry["e"] = " ".join(evicted)
        pipe.expire(self.blocks_key, self.ttl_s)
        pipe.xadd(redis_keys.PREFIX_LOG, entry, maxlen=self.maxlen, approximate=True)
        pipe.execute()

    def renew(self) -> None:
        """On each heartbeat: the snapshot lives as long as the worker does."""
        try:
            self.redis.expire(self.blocks_key, self.ttl_s)
        except redis.RedisError:
            pass  # the heartbeat itself reports the outage
