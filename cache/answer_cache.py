"""The answer cache as the gateway uses it: look up (exact, then semantic), store, stay in step.

This module builds the parts and hands the gateway one object; each part has one job:
- cache/lookup_path.py: a question looked up, a hit or a miss (never an error);
- cache/insert_path.py: the model's answer after a miss, stored, pooled or learned from;
- cache/thresholds.py: the serving thresholds and each entry's bar, moved by evidence
  (cache/evidence.py: near misses, audits, feedback);
- cache/log_follower.py: this gateway's FAISS indexes (cache/local_indexes.py, one per
  namespace) rebuilt from Redis at start, then following the log every gateway appends to;
- cache/sweeper.py: expired entries deleted (any gateway may), the thresholds relearned.
"""
from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Callable, Coroutine

import numpy as np
from redis.exceptions import RedisError

from cache.embedder import Embedder
from cache.evidence import Learned, Observation
from cache.hit_rule import Candidate, OperatingPoint
from cache.index import VectorIndex
from cache.insert_path import InsertPath, reusable_for_rewordings
from cache.local_indexes import LocalIndexes
from cache.log_follower import SharedLogFollower
from cache.lookup_path import Hit, Lookup, LookupPath
from cache.pair_model import PAIR_WEIGHTS, PairModel
from cache.query import CacheQuery
from cache.store import EntryStore
from cache.sweeper import Sweeper
from cache.thresholds import Thresholds, trained_floor, trained_point
from ops.core.redis_clients import CACHE_TIMEOUT_S, async_client
from ops.core.settings import Settings

log = logging.getLogger("brigade.cache")

# Names the gateway (Hit, Lookup) and ops/training/pair_model/evaluation.py (reusable_for_rewordings) import from here.
__all__ = ["AnswerCache", "Hit", "Lookup", "reusable_for_rewordings"]


class AnswerCache:
    def __init__(self, settings: Settings, embedder: Embedder | None = None, pair_model: PairModel | None = None,
                 connect: bool = True, spawn: Callable[[Coroutine], None] | None = None):
        self.settings = settings
        self.redis = async_client(settings.cache_redis, timeout_s=CACHE_TIMEOUT_S) if connect else None
        self.store = EntryStore(self.redis, settings) if connect else None
        self.embedder = embedder or Embedder.for_settings(settings)
        pair_model = pair_model if pair_model is not None else self._load_pair_model()
        # Bookkeeping writes and index rebuilds, kept off the hit path: in the gateway's background
        # tasks when it gives its `spawn` (it waits for them at shutdown), else in a set of our own.
        self._spawn = spawn
        self._background: set[asyncio.Task] = set()
        self.local = LocalIndexes(self.embedder.dim, settings.cache_hnsw_from, self._in_background)
        self.thresholds = Thresholds(trained_point(pair_model, settings), settings.cache_max_error, self.store,
                                     self.local, trained_floor(pair_model))
        self.lookups = LookupPath(self.store, self.embedder, pair_model, self.local, self.thresholds,
                                  self._in_background, fallback=settings.cache_fallback,
                                  samples=settings.cache_samples, max_candidates=settings.cache_candidates,
                                  min_similarity=settings.cache_min_similarity)
        self.inserts = InsertPath(self.store, self.embedder, self.local, self.thresholds,
                                  samples=settings.cache_samples, answer_agreement=settings.cache_answer_agreement,
                                  judge_margin=settings.cache_judge_margin)
        self.follower = SharedLogFollower(self.redis, self.store, self.local)
        self.sweeper = Sweeper(self.store, self.local, settings.cache_sweep_interval_s,
                               after_each=self.thresholds.relearn)

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

    def _in_background(self, coro: Coroutine) -> None:
        if self._spawn is not None:
            self._spawn(coro)
            return
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ---- the semantic rule and its thresholds ----------------------------------------------------

    @property
    def pair_model(self) -> PairModel | None:
        return self.lookups.pair_model

    @pair_model.setter
    def pair_model(self, pair_model: PairModel | None) -> None:
        """Another pair model (ops/training/pair_model/tuning.py swaps in the one it tuned): its trained numbers too."""
        self.lookups.pair_model = pair_model
        self.thresholds.trained = trained_point(pair_model, self.settings)
        self.thresholds.floor = trained_floor(pair_model)

    @property
    def semantic_mode(self) -> str:
        """Who decides semantic hits: the pair model ("pair"), the cosine rule ("cosine", only when
        BRIGADE_CACHE_FALLBACK asks for it), or nobody ("off": exact hits only)."""
        return self.lookups.semantic_mode

    @property
    def operating_point(self) -> OperatingPoint | None:
        """The semantic rule's trained numbers (stored with the pair model; the cosine rule's without
        one), each overridable from settings; None when the semantic layer is off. Evidence then
        moves them (`Thresholds.point`)."""
        return self.thresholds.trained

    async def relearn(self) -> Learned | None:
        """Read the evidence and move the thresholds (every sweep; any gateway reads the same list)."""
        return await self.thresholds.relearn()

    async def observe(self, observation: Observation) -> None:
        """Keep one piece of evidence (cache/evidence.observed); a wrong answer raises its entry's bar."""
        await self.thresholds.observe(observation)

    # ---- lookup and store ------------------------------------------------------------------------

    async def lookup(self, query: CacheQuery) -> Lookup:
        return await self.lookups.lookup(query)

    def candidates(self, index: VectorIndex | None, question: str, vector: np.ndarray) -> list[Candidate]:
        return self.lookups.candidates(index, question, vector)

    def scored(self, question: str, candidates: list[Candidate], point: OperatingPoint) -> list[Candidate]:
        return self.lookups.scored(question, candidates, point)

    async def insert(self, query: CacheQuery, lookup: Lookup | None, chunks: list[str], finish_reason: str,
                     prompt_tokens: int, completion_tokens: int) -> str | None:
        return await self.inserts.insert(query, lookup, chunks, finish_reason, prompt_tokens, completion_tokens)

    async def forget(self, entry_id: str, asked: str | None = None) -> bool:
        """A user said this entry's answer was wrong: evict it everywhere, learn from it."""
        removed = await self.store.forget(entry_id, asked)
        self.local.forget(entry_id)
        log.info("event=cache_entry_forgotten entry=%s removed=%s", entry_id, removed)
        return removed

    # ---- staying in step with the other gateways ---------------------------------------------------

    async def rebuild(self) -> int:
        return await self.follower.rebuild()

    async def follow(self, block_ms: int = 1000) -> None:
        await self.follower.follow(block_ms)

    async def sweep(self) -> int:
        return await self.sweeper.sweep()

    async def start(self) -> list[asyncio.Task]:
        """Rebuild, then follow the log and sweep in the background (the gateway calls this)."""
        try:
            await self.rebuild()
            await self.relearn()
        except (RedisError, OSError) as exc:
            log.warning("event=cache_rebuild_failed error=%r", exc)
        return [asyncio.create_task(self.follower.follow(), name="cache-log-follower"),
                asyncio.create_task(self.sweeper.run(), name="cache-sweeper")]

    def size(self) -> int:
        return self.local.size()
