"""Stored responses of `POST /v1/responses`: what `GET /v1/responses/{id}` reads back and what a later
request's `previous_response_id` continues, in Redis, so that any gateway answers for any response.

Each lives `responses_ttl_s`, and at most `responses_max` are kept, the oldest dropped first
(ops/core/redis_keys.py). A response belongs to the API key that created it (when keys are on): another
key is told it does not exist, as for batch jobs.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

import redis.asyncio as aioredis

from ops.core import redis_keys
from ops.core.settings import Settings


@dataclass
class StoredResponse:
    response: dict  # the response object, as GET returns it
    # The chat turns a `previous_response_id` naming this response continues from: the
    # conversation it was given (instructions apart) and its own answer.
    conversation: list[dict]
    request_id: str | None = None  # the server id of its request, while it may still run (cancel)
    owner: str = ""  # the API key id that created it; "" without keys

    @property
    def id(self) -> str:
        return self.response["id"]


class ResponseStore:
    def __init__(self, redis: aioredis.Redis, settings: Settings):
        self.redis = redis
        self.settings = settings

    async def put(self, stored: StoredResponse) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(redis_keys.response(stored.id), json.dumps(asdict(stored)), ex=redis_keys.response_ttl_s(self.settings))
        pipe.zadd(redis_keys.RESPONSES, {stored.id: stored.response.get("created_at") or time.time()})
        pipe.zcard(redis_keys.RESPONSES)
        *_, count = await pipe.execute()
        over = count - redis_keys.responses_max(self.settings)
        if over > 0:
            oldest = [member for member, _ in await self.redis.zpopmin(redis_keys.RESPONSES, over)]
            if oldest:
                await self.redis.delete(*[redis_keys.response(r) for r in oldest])

    async def get(self, response_id: str, owner: str = "") -> StoredResponse | None:
        raw = await self.redis.get(redis_keys.response(response_id))
        if raw is None:
            return None
        stored = StoredResponse(**json.loads(raw))
        return stored if stored.owner == owner else None

    async def exists(self, response_id: str) -> bool:
        return bool(await self.redis.exists(redis_keys.response(response_id)))

    async def delete(self, response_id: str) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.delete(redis_keys.response(response_id))
        pipe.zrem(redis_keys.RESPONSES, response_id)
        await pipe.execute()
