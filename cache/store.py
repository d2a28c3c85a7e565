"""Cache entries in Redis, shared by every gateway, and the log that keeps their indexes in step.

An entry is a hash; the exact layer maps a digest to an entry id; two sorted sets record last
use (for LRU eviction) and expiry (for the TTL sweep); a capped stream logs every add and
delete so that each gateway's FAISS index follows the shared state. Deleting is idempotent and
done once: whoever removes the id from the LRU set does the rest. Every bound (TTL, cap) is
asked of ops/core/redis_keys.py; record_hit is ops/core/lua/record_hit.lua.
"""
from __future__ import annotations

import base64
import hashlib
import json
import random
import time
import uuid
from dataclasses import dataclass

import numpy as np
import redis.asyncio as aioredis

from cache.evidence import Observation
from cache.index import Item
from ops.core import redis_keys, scripts
from ops.core.settings import Settings

# What a hit needs (not the embedding, which only index rebuilds read).
_SERVED_FIELDS = ("question", "chunks", "finish_reason", "prompt_tokens", "completion_tokens", "namespace",
                  "exact_key", "hits", "sampled", "answer", "bar", "alias_of")


@dataclass
class Entry:
    entry_id: str
    question: str
    chunks: list[str]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    namespace: str
    exact_key: str
    vector: np.ndarray | None
    hits: int = 0
    sampled: bool = False  # a sampled question: its answers are a pool (redis_keys.cache_samples)
    answer_digest: str = ""  # of the first answer (hit_rule: rivals holding the same answer do not block)
    bar: float = 0.0  # the entry's own cosine floor (cache/evidence.py)
    alias_of: str = ""  # stored because its answer equals this entry's (a rewording, not a rival)
    pool: int = 0  # answers in the pool when it was read (sampled entries)

    @property
    def answer(self) -> str:
        return "".join(self.chunks)


@dataclass(frozen=True)
class Sample:
    """One answer of a sampled question's pool."""

    chunks: list[str]
    finish_reason: str
    completion_tokens: int

    def to_json(self) -> str:
        return json.dumps({"chunks": self.chunks, "finish_reason": self.finish_reason,
                           "completion_tokens": self.completion_tokens})


def answer_digest(text: str) -> str:
    """The same answer, up to case and spacing."""
    return hashlib.sha256(" ".join(text.lower().split()).encode()).hexdigest()[:16]


class CorruptEntry(ValueError):
    pass


class AlreadyStored(Exception):
    pass


def encode_vector(v: np.ndarray) -> str:
    return base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode()


def decode_vector(s: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(s), dtype="<f4").copy()


def _entry(entry_id: str, raw: dict) -> Entry:
    try:
        return Entry(
            entry_id=entry_id,
            question=raw["question"],
            chunks=json.loads(raw["chunks"]),
            finish_reason=raw["finish_reason"],
            prompt_tokens=int(raw.get("prompt_tokens", 0)),
            completion_tokens=int(raw.get("completion_tokens", 0)),
            namespace=raw["namespace"],
            exact_key=raw["exact_key"],
            vector=decode_vector(raw["vector"]) if raw.get("vector") else None,
            hits=int(raw.get("hits", 0)),
            sampled=raw.get("sampled") == "1",
            answer_digest=raw.get("answer", ""),
            bar=float(raw.get("bar") or 0.0),
            alias_of=raw.get("alias_of", ""),
            pool=int(raw.get("pool", 0)),
        )
    except (KeyError, ValueError, TypeError) as exc:
        raise CorruptEntry(f"cache entry {entry_id} is corrupted: {exc!r}") from None


class EntryStore:
    def __init__(self, client: aioredis.Redis, settings: Settings):
        self.redis = client  # from ops.core.redis_clients: replies are str
        self.ttl_s = redis_keys.cache_entry_ttl_s(settings)
        self.max_entries = redis_keys.cache_max_entries(settings)
        self.log_maxlen = redis_keys.cache_log_maxlen(settings)
        self.hard_negatives_max = redis_keys.cache_hard_negatives_max(settings)
        self.samples_max = redis_keys.cache_samples_max(settings)
        self.evidence_max = redis_keys.cache_evidence_max(settings)
        self.evidence_ttl_s = redis_keys.cache_evidence_ttl_s(settings)
        self._record_hit = scripts.register(client, "record_hit")

    async def get(self, entry_id: str) -> Entry | None:
        raw = await self.redis.hgetall(redis_keys.cache_entry(entry_id))
        return _entry(entry_id, raw) if raw else None

    async def get_exact(self, exact_key: str) -> Entry | None:
        # Two reads, not one script: the entry's key is known only once the first has answered,
        # and a script may touch only the keys it is given. An entry deleted in between reads as
        # a miss, as it would a moment later.
        entry_id = await self.redis.get(redis_keys.cache_exact(exact_key))
        if entry_id is None:
            return None
        return await self.get_served(entry_id)

    async def get_served(self, entry_id: str) -> Entry | None:
        """What a hit needs, and how full a sampled entry's pool is."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hmget(redis_keys.cache_entry(entry_id), list(_SERVED_FIELDS))
        pipe.llen(redis_keys.cache_samples(entry_id))
        values, pool = await pipe.execute()
        if not any(values):
            return None
        return _entry(entry_id, {**{f: v for f, v in zip(_SERVED_FIELDS, values) if v is not None}, "pool": pool})

    async def pick_sample(self, entry_id: str, rng: random.Random) -> Sample | None:
        """One answer of a full pool, at random."""
        rows = await self.redis.lrange(redis_keys.cache_samples(entry_id), 0, self.samples_max - 1)
        if not rows:
            return None
        try:
            d = json.loads(rng.choice(rows))
            return Sample(list(d["chunks"]), str(d["finish_reason"]), int(d["completion_tokens"]))
        except (ValueError, KeyError, TypeError):
            raise CorruptEntry(f"a sample of cache entry {entry_id} is corrupted") from None

    async def add_sample(self, entry_id: str, sample: Sample, exact_key: str | None = None) -> int:
        """Add an answer to a pool that is not full (two gateways may race: the pool is trimmed to
        its size either way); returns the pool's size. `exact_key`: a rewording's exact key, from
        now on pointing at this pool too."""
        key = redis_keys.cache_samples(entry_id)
        ttl = await self.redis.ttl(redis_keys.cache_entry(entry_id))
        if ttl is None or ttl <= 0:  # expired (or never had one): nothing to add to
            return 0
        pipe = self.redis.pipeline(transaction=True)
        pipe.rpush(key, sample.to_json())
        pipe.ltrim(key, 0, self.samples_max - 1)
        pipe.expire(key, ttl)
        if exact_key:
            pipe.set(redis_keys.cache_exact(exact_key), entry_id, ex=ttl, nx=True)
        pipe.hincrby(redis_keys.CACHE_STATS, "samples", 1)
        pipe.llen(key)
        return (await pipe.execute())[-1]

    async def raise_bar(self, entry_id: str, bar: float) -> float | None:
        """Raise an entry's own cosine floor, never lower it (every gateway's index follows the
        log); returns the bar now in force, None when the entry is gone."""
        current = await self.redis.hget(redis_keys.cache_entry(entry_id), "bar")
        if current is None:
            return None
        if float(current or 0.0) >= bar:
            return float(current)
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(redis_keys.cache_entry(entry_id), "bar", bar)
        pipe.xadd(redis_keys.CACHE_LOG, {"op": "bar", "id": entry_id, "bar": bar}, maxlen=self.log_maxlen,
                  approximate=True)
        await pipe.execute()
        return bar

    async def record_hit(self, entry_id: str, layer: str) -> None:
        await self._record_hit(keys=[redis_keys.cache_entry(entry_id), redis_keys.CACHE_LRU, redis_keys.CACHE_STATS],
                               args=[entry_id, time.time(), f"{layer}_hits"])

    async def question_of(self, entry_id: str) -> str | None:
        return await self.redis.hget(redis_keys.cache_entry(entry_id), "question")

    async def add_hard_negative(self, asked: str, stored: str, entry_id: str) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.lpush(redis_keys.CACHE_HARD_NEGATIVES, json.dumps({"asked": asked, "stored": stored, "entry": entry_id,
                                                          "at": time.time()}))
        pipe.ltrim(redis_keys.CACHE_HARD_NEGATIVES, 0, self.hard_negatives_max - 1)
        await pipe.execute()

    async def forget(self, entry_id: str, asked: str | None) -> bool:
        """Evict an entry whose answer was reported wrong; with the question that was asked, keep
        the pair as a hard negative for the next `train-verifier`. False: no such entry (now)."""
        stored = await self.question_of(entry_id)
        removed = await self.delete(entry_id, "reported_wrong")
        if asked and stored is not None:
            await self.add_hard_negative(asked, stored, entry_id)
        return removed

    async def add_observation(self, observation: Observation) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.lpush(redis_keys.CACHE_EVIDENCE, observation.to_json())
        pipe.ltrim(redis_keys.CACHE_EVIDENCE, 0, self.evidence_max - 1)
        pipe.expire(redis_keys.CACHE_EVIDENCE, self.evidence_ttl_s)
        pipe.hincrby(redis_keys.CACHE_STATS, f"evidence_{observation.source}", 1)
        await pipe.execute()

    async def observations(self) -> list[Observation]:
        rows = await self.redis.lrange(redis_keys.CACHE_EVIDENCE, 0, self.evidence_max - 1)
        return [o for o in map(Observation.from_json, rows) if o is not None]

    async def count(self, counter: str, n: int = 1) -> None:
        await self.redis.hincrby(redis_keys.CACHE_STATS, counter, n)

    async def insert(self, entry: Entry) -> list[str]:
        """Store an entry (and log it); returns the ids evicted to stay within max_entries.

        An answer whose exact key is already stored is not stored twice (two gateways that missed
        the same question at once)."""
        if await self.redis.exists(redis_keys.cache_exact(entry.exact_key)):
            raise AlreadyStored(entry.exact_key)
        now = time.time()
        mapping = {
            "question": entry.question, "chunks": json.dumps(entry.chunks), "finish_reason": entry.finish_reason,
            "prompt_tokens": entry.prompt_tokens, "completion_tokens": entry.completion_tokens,
            "namespace": entry.namespace, "exact_key": entry.exact_key, "created": now, "hits": 0,
            "vector": encode_vector(entry.vector) if entry.vector is not None else "",
            "sampled": int(entry.sampled), "answer": entry.answer_digest, "bar": entry.bar,
            "alias_of": entry.alias_of,
        }
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(redis_keys.cache_entry(entry.entry_id), mapping=mapping)
        pipe.expire(redis_keys.cache_entry(entry.entry_id), self.ttl_s)
        if entry.sampled:
            samples = redis_keys.cache_samples(entry.entry_id)
            pipe.rpush(samples, Sample(entry.chunks, entry.finish_reason, entry.completion_tokens).to_json())
            pipe.expire(samples, self.ttl_s)
        pipe.set(redis_keys.cache_exact(entry.exact_key), entry.entry_id, ex=self.ttl_s)
        pipe.zadd(redis_keys.CACHE_LRU, {entry.entry_id: now})
        pipe.zadd(redis_keys.CACHE_EXPIRY, {entry.entry_id: now + self.ttl_s})
        pipe.sadd(redis_keys.cache_namespace(entry.namespace), entry.entry_id)
        pipe.hset(redis_keys.CACHE_ENTRY_NAMESPACE, entry.entry_id, entry.namespace)
        pipe.xadd(redis_keys.CACHE_LOG, {"op": "add", "id": entry.entry_id, "namespace": entry.namespace,
                                   "question": entry.question, "vector": mapping["vector"],
                                   "answer": entry.answer_digest, "bar": entry.bar},
                  maxlen=self.log_maxlen, approximate=True)
        pipe.hincrby(redis_keys.CACHE_STATS, "inserts", 1)
        if entry.alias_of:
            pipe.hincrby(redis_keys.CACHE_STATS, "aliases", 1)
        pipe.zcard(redis_keys.CACHE_LRU)
        size = (await pipe.execute())[-1]
        if size <= self.max_entries:
            return []
        evicted = []
        for entry_id, _ in await self.redis.zpopmin(redis_keys.CACHE_LRU, size - self.max_entries):
            await self._purge(entry_id, "evictions")
            evicted.append(entry_id)
        return evicted

    async def delete(self, entry_id: str, reason: str = "deletions") -> bool:
        """Remove an entry everywhere; False if another caller already did."""
        if not await self.redis.zrem(redis_keys.CACHE_LRU, entry_id):
            return False
        await self._purge(entry_id, reason)
        return True

    async def _purge(self, entry_id: str, reason: str) -> None:
        raw = await self.redis.hmget(redis_keys.cache_entry(entry_id), ["exact_key", "namespace"])
        exact_key, namespace = raw
        # An expired entry's hash is gone already: its namespace is still on record here.
        namespace = namespace or await self.redis.hget(redis_keys.CACHE_ENTRY_NAMESPACE, entry_id)
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(redis_keys.cache_entry(entry_id), redis_keys.cache_samples(entry_id))
        pipe.hdel(redis_keys.CACHE_ENTRY_NAMESPACE, entry_id)
        pipe.zrem(redis_keys.CACHE_EXPIRY, entry_id)
        pipe.zrem(redis_keys.CACHE_LRU, entry_id)
        if namespace:
            pipe.srem(redis_keys.cache_namespace(namespace), entry_id)
        pipe.xadd(redis_keys.CACHE_LOG, {"op": "del", "id": entry_id, "namespace": namespace or ""},
                  maxlen=self.log_maxlen, approximate=True)
        pipe.hincrby(redis_keys.CACHE_STATS, reason, 1)
        await pipe.execute()
        if exact_key:
            # Only if the exact key still points here (a newer entry may have taken it over).
            key = redis_keys.cache_exact(exact_key)
            if await self.redis.get(key) == entry_id:
                await self.redis.delete(key)

    async def expired(self, limit: int = 500) -> list[str]:
        return await self.redis.zrangebyscore(redis_keys.CACHE_EXPIRY, "-inf", time.time(), start=0, num=limit)

    async def scan_entries(self):
        """Every entry as (id, namespace, index item), for rebuilding an index."""
        prefix = len(redis_keys.cache_entry(""))
        async for key in self.redis.scan_iter(match=redis_keys.CACHE_ENTRY_PATTERN, count=1000):
            ns, question, vector, answer, bar = await self.redis.hmget(key, ["namespace", "question", "vector",
                                                                              "answer", "bar"])
            if ns and vector:
                yield key[prefix:], ns, Item(decode_vector(vector), question, answer or "", float(bar or 0.0))

    async def clear(self, namespace: str | None = None) -> int:
        if namespace is None:
            ids = await self.redis.zrange(redis_keys.CACHE_LRU, 0, -1)
        else:
            ids = await self.redis.smembers(redis_keys.cache_namespace(namespace))
        removed = 0
        for entry_id in ids:
            removed += await self.delete(entry_id, "cleared")
        return removed


def new_entry_id() -> str:
    return uuid.uuid4().hex
