"""A question looked up: the exact layer, then the semantic one; a hit, or a miss the model fills.

Lookups never fail a request: any cache problem (Redis down, a corrupted entry) is logged and
counted as a miss. A sampled entry whose pool is short is a miss too, and says so (`Lookup.pool`),
so that the model's answer joins the pool; a proposal the rule did not serve comes back as the
near miss (`Lookup.near`) the model's answer is compared with (cache/insert_path.py). Counting
hits and misses is bookkeeping, written in the background, off the hit's path.
"""
from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass, replace
from typing import Callable, Coroutine

import numpy as np
from redis.exceptions import RedisError

from cache.embedder import Embedder
from cache.hit_rule import Candidate, OperatingPoint, choose, proposals
from cache.index import VectorIndex
from cache.local_indexes import LocalIndexes
from cache.pair_model import PairModel
from cache.query import CacheQuery
from cache.store import CorruptEntry, Entry, EntryStore
from cache.thresholds import Thresholds, semantic_mode
from cache.vetoes import conflicts

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


class LookupPath:
    def __init__(self, store: EntryStore | None, embedder: Embedder, pair_model: PairModel | None,
                 local: LocalIndexes, thresholds: Thresholds, in_background: Callable[[Coroutine], None], *,
                 fallback: str, samples: int, max_candidates: int, min_similarity: float):
        self.store = store
        self.embedder = embedder
        self.pair_model = pair_model  # None: the fallback rule decides semantic hits (or none do)
        self.local = local
        self.thresholds = thresholds
        self._in_background = in_background  # bookkeeping writes, off the hit's path
        self.fallback = fallback  # BRIGADE_CACHE_FALLBACK: "off" or "cosine" without the pair model
        self.samples = samples  # a sampled question's pool serves once it holds this many answers
        self.max_candidates = max_candidates  # nearest stored questions read from the index
        self.min_similarity = min_similarity  # the cosine floor below which none is a candidate
        self.rng = random.Random()  # which of a full pool's answers is served

    @property
    def semantic_mode(self) -> str:
        return semantic_mode(self.pair_model, self.fallback)

    async def lookup(self, query: CacheQuery) -> Lookup:
        if query.mode == "off":
            return Lookup(None)
        vector = None
        try:
            entry = await self.store.get_exact(query.exact_key)
            if entry is not None:
                return await self._serve(entry, Hit(entry, "exact", 1.0), vector)
            if query.mode == "exact" or not query.question or self.semantic_mode == "off":
                self._in_background(self._count("misses"))
                return Lookup(None)
            vector = await asyncio.to_thread(self.embedder.embed_one, query.question)
            hit, near = await self._semantic(query, vector)
            if hit is None:
                self._in_background(self._count("misses"))
                return Lookup(None, vector, near=near)
            return await self._serve(hit.entry, hit, vector)
        except (RedisError, OSError, CorruptEntry) as exc:
            log.warning("event=cache_lookup_failed error=%r", exc)
            return Lookup(None, vector)

    async def _serve(self, entry: Entry, hit: Hit, vector: np.ndarray | None) -> Lookup:
        """A stored answer, or one of a full pool's; a short pool is a miss that the model fills."""
        if entry.sampled:
            if entry.pool < self.samples:
                self._in_background(self._count("pool_fills"))
                return Lookup(None, vector, pool=entry.entry_id)
            sample = await self.store.pick_sample(entry.entry_id, self.rng)
            if sample is None:  # the pool expired in between
                return Lookup(None, vector)
            hit.entry = replace(entry, chunks=sample.chunks, finish_reason=sample.finish_reason,
                                completion_tokens=sample.completion_tokens)
        self._in_background(self._record(entry.entry_id, hit.layer))
        return Lookup(hit, vector)

    def candidates(self, index: VectorIndex | None, question: str, vector: np.ndarray) -> list[Candidate]:
        """The nearest stored questions above the cosine floor, with the guards' vetoes (cheap)."""
        if index is None:
            return []
        return [Candidate(n.entry_id, n.question, n.similarity, tuple(conflicts(question, n.question)),
                          answer=n.item.answer, bar=n.item.bar)
                for n in index.search(vector, self.max_candidates)
                if n.similarity >= self.min_similarity]

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
        """The thresholds serving now, with the request's own `cache_threshold` as serve_cosine."""
        point = self.thresholds.point
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
