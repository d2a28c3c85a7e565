"""Per-key limits that hold across every gateway: requests per minute, tokens per minute and
concurrent requests, kept in Redis and decided by one Lua script (ops/core/lua/admit.lua), so
that two gateways can never both admit the last free request.

- rpm: a sliding-window log, one sorted-set member per admitted request (scored by its admission
  time), trimmed to the window. Exact: with rpm 10, a burst of 100 admits 10, and the next
  admission is possible when the oldest of them leaves the window.
- tpm: a request's tokens are known only once its answer ends, so `charge_tokens` adds them to
  the window afterwards, and admission refuses while the tokens charged in the last window are
  at or above the limit (the rule LiteLLM applies): the request that crosses the limit is
  answered in full, and the key waits until enough of its tokens have left the window.
- max_concurrent: the requests admitted and not yet released, with their start times. A member
  older than `stale_s` is dropped, so that a gateway that crashed before releasing cannot hold a
  slot for ever.

Admission checks all three and writes only when it admits: a refused request consumes nothing.
When several limits refuse, the refusal names the one with the longest wait, so that a retry at
retry_after_s is not refused by another. A limit of 0 is unlimited and keeps no state.

Times are Redis's clock (TIME), so gateways on machines whose clocks disagree still share one
window, and admissions are scored in the order they really happened; tests pass `now` instead.
Request ids must be unique (the gateway's uuid): a second admission under the same id would
overwrite the first's member instead of counting again.
"""
from __future__ import annotations

import math
import secrets
from dataclasses import dataclass

import redis.asyncio as aioredis

from gateway.admission.api_keys import ApiKey
from ops.core import redis_keys, scripts

RATE_LIMITED = "rate_limited"
REQUESTS, TOKENS, CONCURRENT = "rpm", "tpm", "max_concurrent"


@dataclass(frozen=True)
class Refusal:
    code: str  # always RATE_LIMITED
    message: str  # names the limit that was hit, with its number
    retry_after_s: float  # when a retry can be admitted (> 0)
    limit: str  # which one: REQUESTS, TOKENS or CONCURRENT


class KeyLimiter:
    def __init__(self, client: aioredis.Redis, window_s: float = 60, stale_s: float = 3600):
        if window_s <= 0 or stale_s <= 0:
            raise ValueError(f"window_s and stale_s must be > 0, not {window_s} and {stale_s}")
        self.redis = client
        self.window_s = window_s
        self.stale_s = stale_s
        self._admit = scripts.register(client, "admit")

    async def admit(self, key: ApiKey, request_id: str, now: float | None = None) -> Refusal | None:
        """Admit and record one request of `key`, or say which limit refuses it and until when."""
        refused = await self._admit(
            keys=[redis_keys.key_requests(key.id), redis_keys.key_tokens(key.id), redis_keys.key_tokens_total(key.id),
                  redis_keys.key_in_flight(key.id)],
            args=["" if now is None else repr(float(now)), repr(float(self.window_s)),
                  redis_keys.key_window_ttl_ms(self.window_s), key.rpm, key.tpm, key.max_concurrent, request_id,
                  repr(float(self.stale_s)), redis_keys.key_in_flight_ttl_ms(self.stale_s)])
        if refused is None:
            return None
        limit, wait, used = refused[0], float(refused[1]), int(float(refused[2]))
        return Refusal(RATE_LIMITED, self._message(key, limit, used, wait), wait, limit)

    async def charge_tokens(self, key_id: str, tokens: int, now: float | None = None) -> None:
        """Count an answer's tokens (prompt + completion) in the key's window, once it has ended."""
        if tokens <= 0:
            return
        if now is None:
            seconds, micros = await self.redis.time()  # the clock admission reads (admit.lua)
            now = seconds + micros / 1e6
        window_ms = redis_keys.key_window_ttl_ms(self.window_s)
        charges, total = redis_keys.key_tokens(key_id), redis_keys.key_tokens_total(key_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            # the nonce keeps two equal charges at one instant apart (sorted-set members are unique)
            pipe.zadd(charges, {f"{int(tokens)}:{secrets.token_hex(6)}": now})
            pipe.incrby(total, int(tokens))
            pipe.pexpire(charges, window_ms)
            pipe.pexpire(total, window_ms)
            await pipe.execute()

    async def release(self, key_id: str, request_id: str) -> None:
        """The request ended (answered, failed or cancelled): its concurrency slot is free."""
        await self.redis.zrem(redis_keys.key_in_flight(key_id), request_id)

    def _message(self, key: ApiKey, limit: str, used: int, wait: float) -> str:
        window = "minute" if self.window_s == 60 else f"{self.window_s:g} s"
        retry = f"retry in {math.ceil(wait)} s"
        if limit == REQUESTS:
            return f"this API key is limited to {key.rpm} requests per {window}; {retry}"
        if limit == TOKENS:
            return (f"this API key is limited to {key.tpm} tokens per {window} and has used {used} in the "
                    f"last {window}; {retry}")
        return (f"this API key is limited to {key.max_concurrent} concurrent requests and has {used} "
                f"running; {retry}, or when one of them ends")
