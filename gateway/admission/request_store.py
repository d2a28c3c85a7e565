"""What this gateway writes about a request in Redis: its place on the queue, its stop, its outcome.

A request goes on the queue as three writes: its record (for a resume, a reaper, a continuing
worker), its unclaimed mark (the reaper's way to find a message lost before its claim), then the
message itself. Stopping a request marks it cancelled everywhere (queued, it never runs; running,
its worker frees the slot). Each answer's outcome goes into its version's stream, which canaries
compare (ops/rollout/outcomes.py).
"""
from __future__ import annotations

import asyncio
import json
import logging
import time

import redis.asyncio as aioredis

from gateway.admission.catalog import Choice
from ops.core import redis_keys
from ops.rollout import outcomes
from ops.core.messages import QueuedRequest
from ops.core.queue import SEND_ERRORS, QueueSender
from ops.core.redis_clients import through_failover
from ops.core.settings import Settings

log = logging.getLogger("brigade.gateway")


class RequestStore:
    def __init__(self, settings: Settings, redis: aioredis.Redis, sender: QueueSender):
        self.settings = settings
        self.redis = redis
        self.sender = sender

    async def put(self, queued: QueuedRequest, worker: str | None = None) -> None:
        """The record, the unclaimed mark, then the message (see the module's note); on `worker`'s
        own queue when routing chose one (gateway/admission/routing.py)."""
        rid = queued.request_id

        # When it went on the queue (not when it arrived: admission may have taken a while), in its
        # unclaimed mark and on its message alike (QueueSender.send says why).
        at = time.time()

        async def put() -> None:
            pipe = self.redis.pipeline(transaction=False)
            pipe.set(redis_keys.request(rid), json.dumps(queued.model_dump(mode="json")), ex=redis_keys.request_ttl_s(self.settings))
            pipe.zadd(redis_keys.UNCLAIMED, {rid: at})
            if self.settings.confirmations:
                # On a replica before the message goes: should a failover lose the message, the
                # record and the mark survive it, and the reaper sends the request again.
                pipe.execute_command("WAIT", self.settings.confirmations, self.settings.confirm_ms)
            await pipe.execute()
            await asyncio.to_thread(self.sender.send, queued, True, worker, at)

        # Through a Sentinel failover the request waits for the new primary instead of failing; a
        # second message after a send that failed late is a duplicate delivery, which the claim skips.
        await through_failover(put, self.settings.failover_budget_s, SEND_ERRORS)

    async def stop(self, rid: str) -> None:
        """Cancel a request everywhere: queued, it never runs; running, it frees its slot."""
        try:
            await self.redis.set(redis_keys.cancelled(rid), "1", ex=redis_keys.cancelled_ttl_s(self.settings))
            await self.redis.zrem(redis_keys.UNCLAIMED, rid)
            await self.redis.publish(redis_keys.CANCEL_CHANNEL, rid)
        except aioredis.RedisError as exc:
            log.warning("event=cancel_failed request_id=%s error=%r", rid, exc)

    async def record(self, choice: Choice, outcome: outcomes.Outcome) -> None:
        """One outcome in its version's stream, which canaries compare (ops/rollout/outcomes.py)."""
        try:
            await outcomes.record(self.redis, self.settings, choice.model, choice.version, outcome)
        except aioredis.RedisError as exc:
            log.debug("event=outcome_not_recorded model=%s error=%r", choice.served, exc)
