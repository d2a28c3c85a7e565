"""The answer cache as the gateway uses it: look up (exact, then semantic), store, stay in step.

Lookups never fail a request: any cache problem (Redis down, a corrupted entry) is logged and
counted as a miss. Each gateway keeps one FAISS index per namespace (cache/local_indexes.py),
rebuilt from Redis at start and then following the shared log; any gateway may sweep expired
entries. A miss whose answer the model gave is stored, added to a sampled question's pool, or
compared with a near miss's stored answer: evidence for the thresholds (cache/evidence.py).
"""
from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Coroutine

import numpy as np
from redis.exceptions import RedisError

from cache.embedder import Embedder
from cache.evidence import BAR_MARGIN, Learned, Observation, answers_agree, learn, observed, same_text
from cache.guards import conflicts
from cache.hit_rule import Candidate, OperatingPoint, choose, point_from, proposals
from cache.index import Item, VectorIndex
from cache.local_indexes import LocalIndexes
from cache.pair_model import PAIR_WEIGHTS, PairModel
from cache.query import CacheQuery
from cache.store import (AlreadyStored, CorruptEntry, Entry, EntryStore, Sample, answer_digest, decode_vector,
                         new_entry_id)
from ops.core import keys
from ops.core.redis_clients import CACHE_TIMEOUT_S, async_client
from ops.core.settings import Settings

log = logging.getLogger("brigade.cache")


@dataclass
class Hit:
    entry: Entry
    layer: str  # "exact" or "semantic"
    similarity: float  # cosine of the questions (1.0 for exact)
    score: float | None = None  # the pair model's probability (semantic hits)


@dataclass
class Lookup:
    hit: Hit | None
    vector: np.ndarray | None = None  # the question's embedding, reused when the answer is stored
    pool: str | None = None  # a sampled entry whose pool is short: the model's answer joins it
    near: Candidate | None = None  # a proposal not served: the model's answer is compared with its


class AnswerCache:
    def __init__(self, settings: Settings, embedder: Embedder | None = None, pair_model: PairModel | None = None,
                 connect: bool = True, spawn: Callable[[Coroutine], None] | None = None):
        self.settings = settings
        self.redis = async_client(settings.cache_redis, timeout_s=CACHE_TIMEOUT_S) if connect else None
        self.store = EntryStore(self.redis, settings) if connect else None
        self.embedder = embedder or Embedder(
            settings.embedding_model or None, threads=settings.embedding_threads, int8=settings.embedding_int8
        )
        self.pair_model = pair_model if pair_model is not None else self._load_pair_model()
        self.learned: Learned | None = None
        self.rng = random.Random()
        self._log_cursor = "0-0"
        # Bookkeeping writes and index rebuilds, kept off the hit path: in the gateway's background
        # tasks when it gives its `spawn` (it waits for them at shutdown), else in a set of our own.
        self._spawn = spawn
        self._pending: set[asyncio.Task] = set()
        self.local = LocalIndexes(self.embedder.dim, settings.cache_hnsw_from, self._later)

    def _load_pair_model(self) -> PairModel | None:
        if not self.settings.cache_verifier:
            return None
        path = Path(self.settings.cache_pair_model) if self.settings.cache_pair_model else PAIR_WEIGHTS
        try:
            return PairModel.shared(path, threads=self.settings.embedding_threads)
        except Exception as exc:  # missing or unreadable weights: the fallback rule decides, loudly
            log.error("event=pair_model_unavailable path=%s error=%r semantic=%s", path, exc,
                      self.settings.cache_fallback)
            return None

    def _later(self, coro) -> None:
        if self._spawn is not None:
            self._spawn(coro)
            return
        task = asyncio.ensure_future(coro)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    @property
    def semantic_mode(self) -> str:
        """Who decides semantic hits: the pair model ("pair"), the cosine rule ("cosine", only when
        BRIGADE_CACHE_FALLBACK asks for it), or nobody ("off": exact hits only)."""
        if self.pair_model is not None:
            return "pair"
        return self.settings.cache_fallback

    @property
    def operating_point(self) -> OperatingPoint | None:
        """The semantic rule's trained numbers (stored with the pair model; the cosine rule's without
        one), each overridable from settings; None when the semantic layer is off. Evidence then
        moves them (`point`)."""
        s = self.settings
        if self.semantic_mode == "pair":
            return point_from(self.pair_model.info.get("operating_point", {}), s)
        if self.semantic_mode == "cosine":
            serve = s.cache_serve_cosine if s.cache_serve_cosine is not None else s.cache_cosine_threshold
            return OperatingPoint(serve_cosine=serve, band_cosine=serve)
        return None

    @property
    def point(self) -> OperatingPoint | None:
        """The operating point serving now: the trained one as the evidence moved it."""
        return self.learned.point if self.learned is not None else self.operating_point

    async def relearn(self) -> Learned | None:
        """Read the evidence and move the thresholds (every sweep; any gateway reads the same list)."""
        trained = self.operating_point
        if trained is None or self.store is None:
            return None
        observations = await self.store.observations()
        self.learned = learn(observations, trained, self.settings.cache_max_error)
        return self.learned

    # ---- lookup ----------------------------------------------------------------------------

    async def lookup(self, query: CacheQuery) -> Lookup:
        if query.mode == "off":
            return Lookup(None)
        vector = None
        try:
            entry = await self.store.get_exact(query.exact_key)
            if entry is not None:
                return await self._serve(entry, Hit(entry, "exact", 1.0), vector)
            if query.mode == "exact" or not query.question or self.semantic_mode == "off":
                self._later(self._count("misses"))
                return Lookup(None)
            vector = await asyncio.to_thread(self.embedder.embed_one, query.question)
            hit, near = await self._semantic(query, vector)
            if hit is None:
                self._later(self._count("misses"))
                return Lookup(None, vector, near=near)
            return await self._serve(hit.entry, hit, vector)
        except (RedisError, OSError, CorruptEntry) as exc:
            log.warning("event=cache_lookup_failed error=%r", exc)
            return Lookup(None, vector)

    async def _serve(self, entry: Entry, hit: Hit, vector: np.ndarray | None) -> Lookup:
        """A stored answer, or one of a full pool's; a short pool is a miss that the model fills."""
        if entry.sampled:
            if entry.pool < self.settings.cache_samples:
                self._later(self._count("pool_fills"))
                return Lookup(None, vector, pool=entry.entry_id)
            sample = await self.store.pick_sample(entry.entry_id, self.rng)
            if sample is None:  # the pool expired in between
                return Lookup(None, vector)
            hit.entry = replace(entry, chunks=sample.chunks, finish_reason=sample.finish_reason,
                                completion_tokens=sample.completion_tokens)
        self._later(self._record(entry.entry_id, hit.layer))
        return Lookup(hit, vector)

    def candidates(self, index: VectorIndex | None, question: str, vector: np.ndarray) -> list[Candidate]:
        """The nearest stored questions above the cosine floor, with the guards' vetoes (cheap)."""
        if index is None:
            return []
        return [Candidate(n.entry_id, n.question, n.similarity, tuple(conflicts(question, n.question)),
                          answer=n.item.answer, bar=n.item.bar)
                for n in index.search(vector, self.settings.cache_candidates)
                if n.similarity >= self.settings.cache_min_similarity]

    def scored(self, question: str, candidates: list[Candidate], point: OperatingPoint) -> list[Candidate]:
        """The pair model's say on the (at most two) proposals (slow: about 5-10 ms each on one
        core, so run it off the event loop); the other candidates are left unscored."""
        asked = proposals(candidates, point)
        if self.pair_model is None or not asked:
            return candidates
        scores = dict(zip((c.entry_id for c in asked),
                          self.pair_model.score(question, [c.question for c in asked]).tolist()))
        return [replace(c, score=scores[c.entry_id]) if c.entry_id in scores else c for c in candidates]

    def point_for(self, query: CacheQuery) -> OperatingPoint | None:
        point = self.point
        if point is not None and query.threshold is not None:
            point = replace(point, serve_cosine=query.threshold).clamped()
        return point

    async def _semantic(self, query: CacheQuery, vector: np.ndarray) -> tuple[Hit | None, Candidate | None]:
        """The hit, or the best proposal that was not served (a near miss, to learn from)."""
        point = self.point_for(query)
        candidates = self.candidates(self.local.indexes.get(query.namespace), query.question, vector)
        if point is None or not proposals(candidates, point):
            return None, None
        try:
            candidates = await asyncio.to_thread(self.scored, query.question, candidates, point)
        except Exception as exc:  # the pair model failed: no semantic hit rather than an unverified one
            log.error("event=pair_model_failed error=%r", exc)
            return None, None
        chosen = choose(candidates, point)
        if chosen is None:
            return None, proposals(candidates, point)[0]
        entry = await self.store.get_served(chosen.entry_id)
        if entry is None:  # expired in Redis before the sweep reached it
            self.local.forget(chosen.entry_id)
            return None, None
        return Hit(entry, "semantic", chosen.cosine, chosen.score), None

    async def _record(self, entry_id: str, layer: str) -> None:
        try:
            await self.store.record_hit(entry_id, layer)
        except RedisError as exc:
            log.warning("event=cache_hit_record_failed error=%r", exc)

    async def _count(self, counter: str) -> None:
        try:
            await self.store.count(counter)
        except RedisError:
            pass

    # ---- store -------------------------------------------------------------------------------

    async def insert(self, query: CacheQuery, lookup: Lookup | None, chunks: list[str], finish_reason: str,
                     prompt_tokens: int, completion_tokens: int) -> str | None:
        """Store a finished answer (the model's, after `lookup` missed); returns the entry id it went
        to (None when not stored). A short pool gets it as one more sample; a near miss learns from it."""
        if query.mode == "off":
            return None
        lookup = lookup or Lookup(None)
        answer = "".join(chunks)
        try:
            if lookup.pool is not None:
                sample = Sample(chunks, finish_reason, completion_tokens)
                await self.store.add_sample(lookup.pool, sample, exact_key=query.exact_key)
                return lookup.pool
            alias_of = await self._learn_from_near_miss(lookup.near, answer, query.sampled)
        except (RedisError, OSError, CorruptEntry) as exc:
            log.warning("event=cache_insert_failed error=%r", exc)
            return None
        # The same request gets the same answer, so the exact layer keeps any finished one; only
        # answers fit to serve to a rewording get a vector (the semantic layer): not a loop, and
        # (through the namespace) only for the same max_tokens.
        vector = lookup.vector
        if not reusable_for_rewordings(answer, finish_reason):
            vector = None
        elif vector is None and query.question:
            vector = await asyncio.to_thread(self.embedder.embed_one, query.question)
        try:
            entry = Entry(new_entry_id(), query.question, chunks, finish_reason, prompt_tokens, completion_tokens,
                          query.namespace, query.exact_key, vector, sampled=query.sampled,
                          answer_digest=answer_digest(answer), alias_of=alias_of or "")
            evicted = await self.store.insert(entry)
        except AlreadyStored:
            if query.sampled:  # another gateway stored this question first: the answer joins its pool
                return await self._join_pool(query, chunks, finish_reason, completion_tokens)
            return None
        except (RedisError, OSError) as exc:
            log.warning("event=cache_insert_failed error=%r", exc)
            return None
        if vector is not None and query.question:
            self.local.add(query.namespace, entry.entry_id, Item(vector, query.question, entry.answer_digest))
        for entry_id in evicted:
            self.local.forget(entry_id)
        return entry.entry_id

    async def _join_pool(self, query: CacheQuery, chunks: list[str], finish_reason: str,
                         completion_tokens: int) -> str | None:
        try:
            entry = await self.store.get_exact(query.exact_key)
            if entry is None or not entry.sampled or entry.pool >= self.settings.cache_samples:
                return None
            await self.store.add_sample(entry.entry_id, Sample(chunks, finish_reason, completion_tokens))
            return entry.entry_id
        except (RedisError, OSError, CorruptEntry) as exc:
            log.warning("event=cache_insert_failed error=%r", exc)
            return None

    async def _learn_from_near_miss(self, near: Candidate | None, answer: str, sampled: bool) -> str | None:
        """Compare the model's answer with the near miss's stored one: evidence for the thresholds.
        The same text word for word (a greedy answer) makes the new entry an alias of the old:
        both hold one answer, so neither is the other's rival. Returns the id to alias."""
        if near is None:
            return None
        stored = await self.store.get_served(near.entry_id)
        if stored is None:
            return None
        agreed = await asyncio.to_thread(answers_agree, stored.answer, answer, self.embedder,
                                         self.settings.cache_answer_agreement)
        await self.observe(observed("near_miss", entry=near.entry_id, cosine=near.cosine, score=near.score,
                                    agreed=agreed))
        return near.entry_id if not sampled and same_text(stored.answer, answer) else None

    async def observe(self, observation: Observation) -> None:
        """Keep one piece of evidence; a wrong answer raises its entry's bar above its cosine."""
        try:
            await self.store.add_observation(observation)
            if not observation.agreed:
                bar = await self.store.raise_bar(observation.entry, round(observation.cosine + BAR_MARGIN, 6))
                if bar is not None:
                    self.local.set_bar(observation.entry, bar)
        except (RedisError, OSError) as exc:
            log.warning("event=cache_evidence_not_recorded error=%r", exc)

    async def forget(self, entry_id: str, asked: str | None = None) -> bool:
        """A user said this entry's answer was wrong: evict it everywhere, learn from it."""
        removed = await self.store.forget(entry_id, asked)
        self.local.forget(entry_id)
        log.info("event=cache_entry_forgotten entry=%s removed=%s", entry_id, removed)
        return removed

    # ---- staying in step with the other gateways ---------------------------------------------------

    async def rebuild(self) -> int:
        """Load every entry from Redis into fresh indexes; remember where the log stood."""
        last = await self.redis.xrevrange(keys.CACHE_LOG, count=1)
        self._log_cursor = last[0][0] if last else "0-0"
        self.local.clear()
        n = 0
        async for entry_id, namespace, item in self.store.scan_entries():
            self.local.add(namespace, entry_id, item)
            n += 1
        log.info("event=cache_index_rebuilt entries=%d namespaces=%d", n, len(self.local.indexes))
        return n

    async def follow(self, block_ms: int = 1000) -> None:
        """Apply the shared add/delete log to the local indexes, forever."""
        while True:
            try:
                replies = await self.redis.xread({keys.CACHE_LOG: self._log_cursor}, block=block_ms, count=1000)
                for _, events in replies or []:
                    for event_id, fields in events:
                        try:
                            self._apply(fields)
                        except Exception:  # one bad log entry must not stop this gateway following
                            log.exception("event=cache_log_entry_failed entry=%s", event_id)
                        self._log_cursor = event_id
                await self._check_not_trimmed()
            except (RedisError, OSError) as exc:
                log.warning("event=cache_follow_failed error=%r", exc)
                await asyncio.sleep(1.0)

    def _apply(self, event: dict) -> None:
        if event.get("op") == "add" and event.get("vector"):
            self.local.add(event["namespace"], event["id"], Item(decode_vector(event["vector"]), event.get("question", ""),
                                                            event.get("answer", ""), float(event.get("bar") or 0.0)))
        elif event.get("op") == "bar":
            self.local.set_bar(event["id"], float(event["bar"]))
        elif event.get("op") == "del":
            self.local.forget(event["id"])

    async def _check_not_trimmed(self) -> None:
        # A gateway that fell further behind than the capped log reaches must start over.
        first = await self.redis.xrange(keys.CACHE_LOG, count=1)
        if first and self._log_cursor != "0-0" and _id_lt(self._log_cursor, first[0][0]):
            log.warning("event=cache_log_trimmed_past_cursor cursor=%s", self._log_cursor)
            await self.rebuild()

    async def sweep(self) -> int:
        """Delete expired entries (any gateway may; each id is deleted once)."""
        removed = 0
        for entry_id in await self.store.expired():
            if await self.store.delete(entry_id, "expirations"):
                removed += 1
            self.local.forget(entry_id)
        return removed

    async def sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.cache_sweep_interval_s)
            try:
                await self.sweep()
                await self.relearn()
            except (RedisError, OSError) as exc:
                log.warning("event=cache_sweep_failed error=%r", exc)

    async def start(self) -> list[asyncio.Task]:
        """Rebuild, then follow the log and sweep in the background (the gateway calls this)."""
        try:
            await self.rebuild()
            await self.relearn()
        except (RedisError, OSError) as exc:
            log.warning("event=cache_rebuild_failed error=%r", exc)
        return [asyncio.create_task(self.follow()), asyncio.create_task(self.sweep_forever())]

    def size(self) -> int:
        return self.local.size()


def reusable_for_rewordings(answer: str, finish_reason: str) -> bool:
    """Answers that finished (on their own, or cut by `max_tokens`) and do not loop. A reply cut
    off and repeating one phrase was once served to three rewordings: a loop is what is kept out
    (the exact layer still keeps it). A cut answer that does not loop is what the same request
    would get again, and it is served only to rewordings asked with the same `max_tokens`, since
    `max_tokens` is part of the namespace (cache/query.py). With `max_tokens` 48, most answers
    end by length: only `stop` answers got a vector before, and most rewordings missed."""
    if finish_reason not in ("stop", "length") or not answer.strip():
        return False
    return not repetitive(answer)


def repetitive(text: str, n: int = 4, share: float = 0.25) -> bool:
    """More than `share` of the answer's runs of `n` words are repeats: a model stuck in a loop."""
    words = text.lower().split()
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    return len(grams) >= 2 * n and (len(grams) - len(set(grams))) / len(grams) > share


def _id_lt(a: str, b: str) -> bool:
    ta, sa = (int(x) for x in a.split("-"))
    tb, sb = (int(x) for x in b.split("-"))
    return (ta, sa) < (tb, sb)
