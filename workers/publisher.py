"""Token events out of a worker: after each engine step, one fenced round trip for the whole batch.

Per event (inside ops/core/lua/publish.lua, see claims.py): PUBLISH to the owning gateway's reply channel
(live delivery) and XADD to the request's capped stream (the replay log, with a TTL), unless the
worker's claim on the request was taken over. While Redis is unreachable the events wait here, in
order, and go out with the next step or heartbeat once it answers again.
"""
from __future__ import annotations

import logging

import redis

from ops.core.messages import ReplyEvent
from workers.claims import ClaimStore

log = logging.getLogger("brigade.worker")

# Events held through an outage before giving up on them: by then the heartbeat has long expired
# and the reaper has handed these requests to another worker, so they would be fenced anyway.
MAX_PENDING_EVENTS = 200_000


class TokenPublisher:
    """Not thread-safe: the engine host calls it under its publish lock (engine step or heartbeat)."""

    def __init__(self, claims: ClaimStore):
        self.claims = claims
        self._pending: list[tuple[str, ReplyEvent]] = []
        self._failing = False

    def publish(self, events: list[tuple[str, ReplyEvent]]) -> set[str] | None:
        """Send (reply_channel, event) pairs, after any still waiting. Returns the fenced request
        ids, or None when Redis did not answer (the events are kept for the next call)."""
        self._pending.extend(events)
        if not self._pending:
            return set()
        try:
            fenced = self.claims.publish(self._pending)
        except redis.RedisError as exc:
            if not self._failing:
                log.warning("event=publish_failed pending=%d error=%r", len(self._pending), exc)
            self._failing = True
            if len(self._pending) > MAX_PENDING_EVENTS:
                abandoned = {e.request_id for _, e in self._pending}
                self._pending = []
                log.error("event=publish_abandoned requests=%d", len(abandoned))
                return abandoned
            return None
        if self._failing:
            log.info("event=publish_recovered events=%d", len(self._pending))
            self._failing = False
        self._pending = []
        return fenced

    @property
    def waiting(self) -> int:
        return len(self._pending)
