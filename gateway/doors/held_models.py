"""Requests the gateway answers itself, with a model it holds (the answer cache's embedding model and
pair model: /v1/embeddings, /v1/rerank, /v1/score): nothing is queued for a worker, yet each is
admitted as a chat request is. The caller's key, its per-key limits (one request against rpm and
max_concurrent), and once answered its tokens charged as usage and against tpm; a request that
fails after admission frees its concurrency slot.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

import redis.asyncio as aioredis

from gateway import metrics
from gateway.admission.api_keys import ApiKey
from gateway.admission.lifecycle import RequestLifecycle
from gateway.admission.limits import KeyLimiter
from gateway.doors import openai_schema as oa
from gateway.request import ProtocolError
from ops.core.redis_clients import through_failover
from ops.core.settings import CacheSettings, Settings

EMBEDDING_MODEL = "all-MiniLM-L6-v2"  # the packaged embedding model's name, when no folder is set


def embedding_model_name(settings: CacheSettings) -> str:
    """The name the embedding model is served under: its folder's, or the packaged model's."""
    return Path(settings.embedding_model).name if settings.embedding_model else EMBEDDING_MODEL


log = logging.getLogger("brigade.gateway")


def outcome_of(err: ProtocolError) -> str:
    """A refused request's outcome label: the caller's error or limit, the model away, or a failure."""
    status = oa.status_of(err.code)
    return "unavailable" if status == 503 else "failed" if status >= 500 else "refused"


class HeldModelAdmission:
    def __init__(self, settings: Settings, limiter: KeyLimiter, lifecycle: RequestLifecycle, spawn: Callable):
        self.settings = settings
        self.limiter = limiter
        self.lifecycle = lifecycle  # settles a key's usage (and frees its slot) once answered
        self._spawn = spawn

    async def within_limits(self, key: ApiKey | None, rid: str, model: str) -> None:
        """Take one request of the key's limits, or refuse (rate_limited, with when to retry)."""
        if key is None:
            return
        try:
            refusal = await through_failover(lambda: self.limiter.admit(key, rid), self.settings.failover_budget_s)
        except aioredis.RedisError:
            raise ProtocolError("unavailable", "limits cannot be checked now; try again shortly",
                                retry_after_s=self.settings.retry_after_s) from None
        if refusal is not None:
            log.info("event=rate_limited key=%s request_id=%s why=%r", key.id, rid, refusal.message)
            metrics.RATE_LIMIT_REFUSALS.labels(model, refusal.limit).inc()
            raise ProtocolError(refusal.code, refusal.message, retry_after_s=refusal.retry_after_s)

    def release(self, key: ApiKey | None, rid: str) -> None:
        """The admitted request failed: its concurrency slot is freed, nothing is charged."""
        if key is not None:
            self._spawn(self.lifecycle.release_slot(key.id, rid))

    def settle(self, key: ApiKey | None, rid: str, tokens: int) -> None:
        """The request was answered: its tokens are the key's usage (and count against its tpm)."""
        if key is not None:
            self._spawn(self.lifecycle.settle_usage(key.id, rid, {"prompt_tokens": tokens}, cache_hit=False))
