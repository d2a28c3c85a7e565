"""Messages that left a queue for nobody: found by the reaper within seconds, and sent again.

A request's message can leave its queue and reach no claim in three ways, and each pass of the
reaper (workers/reaper.py) looks for all three:

- its receiver died before claiming it: the worker's transport marked the request taken by it in
  the same transaction as kombu's own record of the delivery (redis_keys.TAKEN, workers/transport.py), so
  a receiver whose heartbeat expired is seen at once, whatever the request's age;
- it was popped and never received: a worker SIGKILLed between its BRPOP and that transaction, or
  a BRPOP answered while its connection was torn down in a Sentinel failover (the answer is read
  by nobody). No mark then, so the reaper asks whether any list of the request's version (its
  shared queue's, and every worker's own) still holds a message as old as the request: each
  message carries the time it was sent (`SENT_HEADER`), and lists are served oldest first, so a
  list whose next message is newer than the request holds it nowhere behind. When none does, it is
  sent again after unclaimed_after_s. Only the tail of each list is read, never a message behind it;
- its worker's own queue (prefix routing, docs/scaling.md) outlived the worker: its messages go
  back to the version's shared queue, in order and ahead of newer work, on every pass.

Sending again is safe when in doubt: a duplicate message meets the claim, which skips it.
"""
from __future__ import annotations

import json
import logging
import time

import redis

from ops.core import redis_keys
from ops.core.messages import QueuedRequest
from ops.core.queue import SENT_HEADER, QueueSender
from ops.core.settings import Settings
from workers.claims import ClaimStore

log = logging.getLogger("brigade.reaper")

STALE_PER_PASS = 500  # unclaimed requests looked at per pass, oldest first
MOVES_PER_PASS = 1000  # messages moved back from dead workers' own queues per pass

Served = tuple[str, str]  # model, version


class QueueSweep:
    def __init__(self, client: redis.Redis, claims: ClaimStore, sender: QueueSender, settings: Settings):
        self.redis = client
        self.claims = claims
        self.sender = sender
        self.settings = settings
        self._served: dict[str, Served] = {}  # request id -> its version, read once from its record

    def sweep(self) -> dict[str, str]:
        """One pass; returns request id -> 'unclaimed' for each request sent again."""
        done = self._dead_receivers()
        self._return_worker_queues()
        done.update(self._lost())
        return done

    def _resend(self, queued: QueuedRequest, receiver: str, at: float) -> None:
        self.sender.send(queued, sent_at=at)  # to its version's shared queue, at the continued priority
        log.info("event=unclaimed_requeued request_id=%s served=%s receiver=%s", queued.request_id,
                 redis_keys.served(queued.model, queued.version), receiver)

    def _dead_receivers(self) -> dict[str, str]:
        takers = self.claims.takers()
        if not takers:
            return {}
        alive = self.claims.alive(set(takers.values()))
        done: dict[str, str] = {}
        for rid, taker in takers.items():
            now = time.time()
            if taker in alive or not self.claims.retake(rid, taker, now):
                continue
            queued = self.claims.queued_request(rid)
            if queued is None or self.redis.exists(redis_keys.cancelled(rid)):
                self.redis.zrem(redis_keys.UNCLAIMED, rid)  # expired or cancelled: nothing to run
                continue
            self._resend(queued, taker, now)
            done[rid] = "unclaimed"
        return done

    def _worker_queues(self) -> dict[str, Served]:
        out: dict[str, Served] = {}
        for instance, raw in self.redis.hgetall(redis_keys.WORKER_QUEUES).items():
            try:
                record = json.loads(raw)
                out[instance] = (str(record["model"]), str(record.get("version") or ""))
            except (ValueError, KeyError, TypeError):
                log.warning("event=worker_queue_unreadable instance=%s", instance)
        return out

    def _return_worker_queues(self) -> None:
        queues = self._worker_queues()
        if not queues:
            return
        alive = self.claims.alive(set(queues))
        registered = set(self.redis.zrange(redis_keys.WORKERS, 0, -1))
        budget = MOVES_PER_PASS
        for instance, (model, version) in queues.items():
            if instance in alive:
                continue
            own = redis_keys.worker_queue_lists(model, version, instance)
            moved = 0
            for source, target in zip(own, redis_keys.queue_lists(model, version)):
                # Newest first onto the pop end: the block keeps its order and goes ahead of newer work.
                while budget > 0 and self.redis.lmove(source, target, "LEFT", "RIGHT") is not None:
                    moved, budget = moved + 1, budget - 1
            if moved:
                log.info("event=worker_queue_returned instance=%s messages=%d served=%s", instance, moved,
                         redis_keys.served(model, version))
            # Forgotten by the registry (silent for FORGET_S): no gateway routes to it any more.
            if instance not in registered and budget > 0:
                pipe = self.redis.pipeline(transaction=False)
                pipe.hdel(redis_keys.WORKER_QUEUES, instance)
                pipe.delete(*own, *redis_keys.kombu_bindings(redis_keys.worker_queue(model, version, instance)))
                pipe.execute()

    def _lost(self) -> dict[str, str]:
        cutoff = time.time() - self.settings.unclaimed_after_s
        stale = self.redis.zrangebyscore(redis_keys.UNCLAIMED, 0, cutoff, start=0, num=STALE_PER_PASS, withscores=True)
        if not stale:
            self._served.clear()
            return {}
        rids = [rid for rid, _ in stale]
        unread = [rid for rid in rids if rid not in self._served]
        pipe = self.redis.pipeline(transaction=False)
        for rid in unread:
            pipe.get(redis_keys.request(rid))
        for rid in rids:
            pipe.exists(redis_keys.cancelled(rid))
        pipe.hmget(redis_keys.TAKEN, rids)
        replies = pipe.execute()
        records, cancelled, takers = replies[:len(unread)], replies[len(unread):-1], replies[-1]
        queued_by_rid: dict[str, QueuedRequest] = {}
        for rid, raw in zip(unread, records):
            if raw is not None:
                queued = QueuedRequest.model_validate_json(raw)
                queued_by_rid[rid] = queued
                self._served[rid] = (queued.model, queued.version)
        oldest: dict[Served, float | None] = {}
        done: dict[str, str] = {}
        for (rid, since), gone, taker in zip(stale, cancelled, takers):
            if gone or rid not in self._served:  # cancelled, or its record expired: nothing to run
                self.redis.zrem(redis_keys.UNCLAIMED, rid)
                self._served.pop(rid, None)
                continue
            if taker is not None:
                continue  # in a live worker's prefetch, or its dead receiver's (the sweep above)
            served = self._served[rid]
            if served not in oldest:
                oldest[served] = self._oldest_waiting(served)
            first = oldest[served]
            if first is not None and first <= since + self.settings.queue_clock_skew_s:
                continue  # a message as old as this request still waits: it may be this one
            now = time.time()
            if not self.claims.take_unclaimed(rid, cutoff, now):
                continue
            queued = queued_by_rid.get(rid) or self.claims.queued_request(rid)
            if queued is not None:
                self._resend(queued, "none", now)
                done[rid] = "unclaimed"
        self._served = {rid: self._served[rid] for rid, _ in stale if rid in self._served}
        return done

    def _oldest_waiting(self, served: Served) -> float | None:
        """When the oldest message at the head of any of this version's lists was sent (its shared
        queue's and each worker's own); None when every list is empty. A message without the stamp
        (from an older sender) counts as older than anything."""
        model, version = served
        lists = list(redis_keys.queue_lists(model, version))
        for instance, (m, v) in self._worker_queues().items():
            if (m, v) == served:
                lists += redis_keys.worker_queue_lists(m, v, instance)
        pipe = self.redis.pipeline(transaction=False)
        for name in lists:
            pipe.lindex(name, -1)
        stamps: list[float] = []
        for raw in pipe.execute():
            if raw is None:
                continue
            try:
                stamps.append(float(json.loads(raw)["headers"][SENT_HEADER]))
            except (ValueError, KeyError, TypeError):
                stamps.append(float("-inf"))
        return min(stamps) if stamps else None
