"""A request leaving this worker unfinished, and who runs it next.

Three ways out: a request taken from the queue while the worker drains goes back untouched; one
held when a drain runs out of time is handed back with its progress (our claim released, so the
next worker continues from the replay log); and one whose claim another worker took over (we
stalled, or a Sentinel failover lost a write) is fenced: stopped, with nothing more published, and
queued again only when nobody else holds it.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

import redis

from engine import Engine
from ops.core import redis_keys
from ops.core.messages import QueuedRequest
from ops.core.queue import QueueSender
from workers.claims import ClaimStore
from workers.held import HeldRequests
from workers.inflight import InFlight

log = logging.getLogger("brigade.worker")


class Handover:
    def __init__(self, instance: str, client: redis.Redis, claims: ClaimStore, sender: QueueSender,
                 held: HeldRequests, engine: Engine, forget_events: Callable[[str], None]):
        self.instance = instance
        self.redis = client
        self.claims = claims
        self.sender = sender  # the worker's own settings' queue, never the environment's
        self.held = held
        self.engine = engine
        # The publisher's memory of a request's events (TokenPublisher.forget): a request that left
        # must not lend its old events' positions to a later run of it here.
        self.forget_events = forget_events

    def send_back(self, queued: QueuedRequest) -> None:
        """Taken from the queue while draining, never claimed: back it goes, untouched."""
        self.sender.send(queued)

    def hand_back(self, entry: InFlight) -> None:
        """Release our claim (fencing ourselves) and queue the request again with its progress."""
        rid = entry.queued.request_id
        self.forget_events(rid)
        try:
            if self.claims.release(rid, self.instance, entry.epoch):
                self.sender.send(entry.queued)
                log.info("event=handed_back request_id=%s", rid)
        except Exception as exc:  # Redis down: the reaper hands it over once the heartbeat stops
            log.warning("event=hand_back_failed request_id=%s error=%r", rid, exc)

    def fenced(self, rid: str) -> None:
        """Our claim was taken over (we stalled, or Redis lost it): stop, publish nothing more."""
        entry = self.held.forget(rid)
        self.forget_events(rid)
        self.engine.cancel(rid)
        log.warning("event=fenced request_id=%s", rid)
        if entry is not None:
            self._requeue_if_orphaned(entry)
            entry.finish_reason = "fenced"
            entry.finished.set()

    def _requeue_if_orphaned(self, entry: InFlight) -> None:
        """Fenced, and nobody holds the request: a Sentinel failover lost a claim (ours, or the raise
        that fenced us). Queue it again, as the reaper would for a dead owner: the next claim has a
        higher epoch (claim.lua) and continues from the replay log."""
        rid = entry.queued.request_id
        try:
            if self.claims.orphaned(rid, self.instance):
                self.redis.zadd(redis_keys.UNCLAIMED, {rid: time.time()})
                self.sender.send(entry.queued)
                log.warning("event=orphan_requeued request_id=%s", rid)
        except redis.RedisError as exc:  # the reaper's unclaimed sweep is the second line
            log.warning("event=orphan_requeue_failed request_id=%s error=%r", rid, exc)
